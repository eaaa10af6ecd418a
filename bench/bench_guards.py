"""What the guardrails cost: the coordinator guards' share of step wall time, same run.

    python bench/bench_guards.py [--steps 3] [--rounds 1]

Runs the shipped tiny campaign in one process, alternating guards on (as shipped) and guards
off, and prints the wall time of the RL steps of each run, their ratio, and the guards' own
seconds as the campaign measured them (``guards_s`` per step in summary.json: the fd guard's
sampling thread, host-memory sampling, the trainer watchdog's checks).

"Guards off" replaces the coordinator's :class:`~t1ops.campaign.guarding.CampaignGuards` with
one that samples nothing and checks nothing (a benchmark-only substitution: no campaign can
turn its guards off) and sets the engine health-ping interval to its maximum. What cannot be
switched off is not in the figure: the sandbox's isolation, the verifier's tamper scan, the
bounded control plane (a timeout costs nothing until it fires) and TITO's accounting are part
of the work itself. Run it on an idle machine: the runs alternate, but load from elsewhere
still widens the noise, which the per-round ratios show.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from t1ops.campaign import guarding, launch
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parent.parent


class _Unguarded(guarding.CampaignGuards):
    """Samples nothing, checks nothing: the baseline the guards are measured against."""

    def __init__(self, cfg, run_dir, dead_engines, pids=None) -> None:
        super().__init__(cfg, run_dir, dead_engines, pids=lambda: [])
        self.fd_guard.stop()
        self.stall.threshold_s = float("inf")

    def attach_trainer(self, pid, stack_path) -> None:
        self.trainer_pid = pid  # no watchdog

    def after_step(self, step: int) -> None:
        pass


def one_run(cfg, guarded: bool, out: str) -> tuple[float, float]:
    """(wall seconds of all RL steps, guard seconds the campaign measured)."""
    cfg = cfg.model_copy(deep=True)
    if not guarded:
        cfg.engine.health_interval_s = 600.0
    launch.CampaignGuards = guarding.CampaignGuards if guarded else _Unguarded
    try:
        run_dir = launch.run_campaign(cfg, out_dir=out, show_progress=False)
    finally:
        launch.CampaignGuards = guarding.CampaignGuards
    steps = json.loads((run_dir / "summary.json").read_text())["steps"]
    return sum(s["step_s"] for s in steps), sum(s.get("guards_s", 0.0) for s in steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="on/off pairs (alternating)")
    ap.add_argument("--config", type=Path, default=REPO / "examples" / "tiny" / "campaign.toml")
    args = ap.parse_args()
    cfg = load_toml(args.config)
    cfg.run.steps = args.steps
    cfg.trainer.warm_start_steps = 10
    cfg.rollout.tasks_dir = str(REPO / cfg.rollout.tasks_dir)
    ratios, guard_shares = [], []
    with tempfile.TemporaryDirectory() as out:
        for rnd in range(1, args.rounds + 1):
            on_s, busy_s = one_run(cfg, True, out)
            off_s, _ = one_run(cfg, False, out)
            ratios.append(on_s / off_s)
            guard_shares.append(busy_s / on_s)
            print(f"round {rnd}: guards on {on_s:7.1f} s, off {off_s:7.1f} s for {args.steps} steps; "
                  f"on/off {on_s / off_s:.3f}; guards measured busy {busy_s:.3f} s = {busy_s / on_s:.2%} of step time")
    print(f"guards on / off wall time: {statistics.median(ratios):.3f} (median of {len(ratios)}; "
          f"1.000 = no overhead; the spread between rounds is the noise)")
    print(f"guards' own measured share of step wall time: {statistics.median(guard_shares):.3%}")


if __name__ == "__main__":
    main()
