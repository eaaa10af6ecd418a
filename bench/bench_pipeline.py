"""One-step pipeline vs a sequential loop: step time of the same tiny campaign, same run.

    python bench/bench_pipeline.py [--steps 4]

Runs the shipped tiny campaign twice on this machine, once with
``run.one_step_pipeline = true`` (batch t+1 generates while step t trains) and
once strictly sequential, and prints the mean step time of each (first step
excluded: it has nothing to overlap with) and their ratio. On a machine where
rollout and training compete for the same two cores the overlap buys less than
on a cluster where they own disjoint GPUs; the ratio is what this machine gives.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from t1ops.campaign.launch import run_campaign
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parent.parent


def mean_step_s(cfg, pipelined: bool, out: str) -> tuple[float, list[float]]:
    cfg = cfg.model_copy(deep=True)
    cfg.run.one_step_pipeline = pipelined
    run_dir = run_campaign(cfg, out_dir=out, show_progress=False)
    steps = json.loads((run_dir / "summary.json").read_text())["steps"]
    times = [s["step_s"] for s in steps]
    return statistics.mean(times[1:]), times


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
        seq, seq_all = mean_step_s(cfg, False, out)
        pipe, pipe_all = mean_step_s(cfg, True, out)
    print(f"sequential  : {seq:6.2f} s/step  {[round(t, 1) for t in seq_all]}")
    print(f"one-step    : {pipe:6.2f} s/step  {[round(t, 1) for t in pipe_all]}")
    print(f"ratio (pipelined / sequential step time): {pipe / seq:.2f}")


if __name__ == "__main__":
    main()
