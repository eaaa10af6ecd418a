"""Measure the campaigns `t1ops plan simulate` is validated against (docs/scale.md), sequentially.

    python bench/scale_runs.py OUT_DIR [--steps 5] [--only NAME ...]

Runs the tiny campaign (examples/tiny/campaign.toml, eval off) as ``one_step`` (the run the
simulator is fitted on), ``sync``, ``fully_async`` (the same pool, with the fully_async section of
examples/tiny/campaign-async.toml), ``fully_async_nofilter`` (the same without the zero-variance
filter) and ``one_step`` with twice the batch, each in its own run directory under OUT_DIR, and writes
OUT_DIR/runs.json mapping name -> run directory plus the load average before and after each.
The runs are sequential: on a shared machine, note the load (it is recorded).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from t1ops.campaign.launch import run_campaign
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parent.parent


def config(name: str, steps: int):
    # every run on the same config and task pool as the fitted one: the share of groups with all-equal
    # rewards is a property of the pool and the policy, which the simulator takes from the fit
    cfg = load_toml(REPO / "examples" / "tiny" / "campaign.toml")
    cfg.run.steps, cfg.run.ray_address, cfg.run.name = steps, "local", f"scale-{name}"
    cfg.eval.every_steps = 0
    cfg.trainer.warm_start_steps = 100
    if name == "sync":
        cfg.run.mode = "sync"
    elif name in ("fully_async", "fully_async_nofilter"):  # the fully_async section of examples/tiny/campaign-async.toml
        cfg.run.mode = "fully_async"
        cfg.fully_async.num_parallel_generation_workers = 8
        cfg.fully_async.max_staleness_steps = 1
        # the filter's drop share is an outcome of learning (docs/scale.md): without it, the run tests
        # the pipeline model alone
        cfg.fully_async.zero_variance_filter = name == "fully_async"
    elif name in ("one_step", "one_step_2x", "one_step_late"):
        cfg.run.mode = "one_step"
    if name == "one_step_2x":
        cfg.rollout.batch_size *= 2
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", nargs="+", default=["one_step", "sync", "fully_async", "fully_async_nofilter", "one_step_2x"])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    index = args.out / "runs.json"
    runs = json.loads(index.read_text()) if index.exists() else {}
    for name in args.only:
        load0, t0 = os.getloadavg()[0], time.time()
        for attempt in range(3):  # a loaded host can time a local Ray's start-up out: start it again
            try:
                run_dir = run_campaign(config(name, args.steps), out_dir=str(args.out), show_progress=False)
                break
            except Exception as err:
                if "timed out during startup" not in str(err) or attempt == 2:
                    raise
                print(f"{name}: Ray start-up timed out (load {os.getloadavg()[0]:.1f}); retrying", flush=True)
        runs[name] = {"run_dir": str(run_dir), "load_start": round(load0, 2), "load_end": round(os.getloadavg()[0], 2),
                      "wall_s": round(time.time() - t0, 1)}
        index.write_text(json.dumps(runs, indent=2))
        print(name, runs[name], flush=True)


if __name__ == "__main__":
    main()
