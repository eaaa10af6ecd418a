"""Fully async vs one-step pipeline: trajectories per second on a long-tail task pool, same run.

    python bench/bench_async.py [--steps 6]

The pool (built in a temporary directory) has the long-tail duration mix agent
RL sees (SkyRL walkthrough, section 2: two turns next to an hour-long trial),
scaled down. Seven tasks, each a copy of a bundled Harbor task whose solution
first sleeps in the trial's sandbox, between the agent's two turns:

    five quick tasks: no sleep          (~1-2 s of generation and verification)
    one medium task : sleep 5 s
    one long task   : sleep 15 s

The policy is warm-started on the solutions and samples greedily, so it runs
them. The same campaign (batch 4 = 2 groups of 2, PPO) runs twice, ``one_step``
then ``fully_async`` (4 group workers, max staleness 2), and the bench prints
trajectories trained per second of RL steps (first rollout to last weight sync;
start-up and warm start excluded) for each, and their ratio (target >= 1.5).
The runs are sequential: run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from t1ops.campaign.launch import run_campaign
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parent.parent
# (new task name, bundled task copied, seconds its solution sleeps first)
MIX = (("quick-touch", "files-touch", 0), ("quick-mkdir", "files-mkdir", 0), ("quick-pwd", "shell-pwd", 0),
       ("quick-hello", "files-hello", 0), ("quick-upper", "text-upper", 0),
       ("medium-build", "files-touch", 5), ("long-build", "files-mkdir", 15))


def make_pool(root: Path) -> Path:
    for name, source, sleep_s in MIX:
        dst = root / name
        shutil.copytree(REPO / "examples" / "tasks" / source, dst)
        if sleep_s:
            solve = dst / "solution" / "solve.sh"
            body = [ln for ln in solve.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
            solve.write_text("#!/bin/bash\nsleep %d && %s\n" % (sleep_s, " && ".join(body)))
            instr = dst / "instruction.md"
            instr.write_text("Run the slow build step first. " + instr.read_text())
            toml = dst / "task.toml"
            toml.write_text(toml.read_text().replace("timeout_sec = 30.0", "timeout_sec = 120.0", 1))
    return root


def config(pool: Path, mode: str, steps: int):
    cfg = load_toml(REPO / "examples" / "tiny" / "campaign.toml")
    cfg.run.mode, cfg.run.steps = mode, steps
    cfg.run.ray_address = "local"  # a fresh local Ray per run, never another job's cluster left on this host
    cfg.rollout.tasks_dir, cfg.rollout.num_train_tasks = str(pool), None
    cfg.rollout.batch_size, cfg.rollout.n_samples_per_prompt, cfg.rollout.temperature = 4, 2, 0.0
    cfg.trainer.warm_start_steps, cfg.trainer.warm_start_noise, cfg.trainer.ppo_epochs = 150, 0.0, 1
    cfg.eval.every_steps = 0  # every task of the pool trains: none is held out
    cfg.fully_async.num_parallel_generation_workers = 4
    cfg.fully_async.max_staleness_steps = 2
    cfg.fully_async.zero_variance_filter = False  # greedy samples of one task agree: keep every group
    cfg.fully_async.staleness_alarm_share = 1.0
    return cfg


def throughput(pool: Path, mode: str, steps: int, out: str) -> tuple[float, dict]:
    run_dir = run_campaign(config(pool, mode, steps), out_dir=out, show_progress=False)
    rows = json.loads((run_dir / "summary.json").read_text())["steps"]
    wall = sum(r["step_s"] for r in rows)
    n = sum(r["num_trajectories"] for r in rows)
    return n / wall, {"trajectories": n, "wall_s": round(wall, 1), "step_s": [round(r["step_s"], 1) for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--keep", type=Path, help="keep the pool and both run directories here (t1ops plan simulate "
                                              "--from reads them; docs/scale.md)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        pool = make_pool(root / "tasks")
        one, one_d = throughput(pool, "one_step", args.steps, str(root))
        fa, fa_d = throughput(pool, "fully_async", args.steps, str(root))
    print("pool: " + ", ".join(f"{n} (sleep {s} s)" for n, _, s in MIX))
    print(f"one_step   : {one:6.3f} trajectories/s  {one_d}")
    print(f"fully_async: {fa:6.3f} trajectories/s  {fa_d}")
    print(f"ratio (fully_async / one_step trajectories per second): {fa / one:.2f}")


if __name__ == "__main__":
    main()
