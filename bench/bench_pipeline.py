"""One-step pipeline vs a sequential loop: step time of the same tiny campaign, same run.

    python bench/bench_pipeline.py [--steps 4]

Runs the shipped tiny campaign twice on this machine, once with
``run.mode = "one_step"`` (batch t+1 generates while step t trains) and
once strictly sequential, and prints the wall time of the N steps in each (from
the first rollout to the last weight sync; start-up and warm start excluded)
and their ratio. Run it on an otherwise idle machine: the two runs are
sequential, so load from elsewhere biases the ratio. On a machine where
rollout and training compete for the same two cores the overlap buys less than
on a cluster where they own disjoint GPUs; the ratio is what this machine gives.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from t1ops.campaign.launch import run_campaign
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parent.parent


def steps_wall_s(cfg, pipelined: bool, out: str) -> tuple[float, list[float]]:
    """Seconds for all RL steps of one run, and the per-step times."""
    cfg = cfg.model_copy(deep=True)
    cfg.run.mode = "one_step" if pipelined else "sync"
    run_dir = run_campaign(cfg, out_dir=out, show_progress=False)
    steps = json.loads((run_dir / "summary.json").read_text())["steps"]
    times = [s["step_s"] for s in steps]
    return sum(times), times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--config", type=Path, default=REPO / "examples" / "tiny" / "campaign.toml")
    args = ap.parse_args()
    cfg = load_toml(args.config)
    cfg.run.steps = args.steps
    cfg.trainer.warm_start_steps = 10
    cfg.rollout.tasks_dir = str(REPO / cfg.rollout.tasks_dir)
    with tempfile.TemporaryDirectory() as out:
        seq, seq_all = steps_wall_s(cfg, False, out)
        pipe, pipe_all = steps_wall_s(cfg, True, out)
    n = len(seq_all)
    print(f"sequential : {seq:7.1f} s for {n} steps ({seq / n:5.1f} s/step)  {[round(t, 1) for t in seq_all]}")
    print(f"one-step   : {pipe:7.1f} s for {n} steps ({pipe / n:5.1f} s/step)  {[round(t, 1) for t in pipe_all]}")
    print(f"ratio (pipelined / sequential wall time): {pipe / seq:.2f}")


if __name__ == "__main__":
    main()
