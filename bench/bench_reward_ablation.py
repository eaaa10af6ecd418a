"""The single-axis reward ablation the T1 report lacked: dense vs binary, held-out reward per seed.

    python bench/bench_reward_ablation.py [--seeds 0 1 2] [--steps N] [--eval-every N]

T1 report, section 10: "No single-axis reward ablation yet ... A same-pool, same-init,
R3-matched binary run would isolate the reward's contribution." For each seed this runs
examples/recipes/t1-report.toml (dense: passed tests / S) and t1-report-binary.toml (the
same file but [rewards] mode = "binary") with that seed: same task split, same warm start,
same everything but the trained reward. Both arms are scored the same way, on held-out
tasks with the verdict's dense reward (summary.json "eval"; the binary arm is trained on
1/0 but evaluated on the same scale), at the last step.

Per seed it prints both held-out rewards (and solved shares), their difference and the eval
noise of that difference, ``2 * sqrt(sem_dense^2 + sem_binary^2)`` (sem: the standard error
of an eval mean over its trials). Over seeds it prints the mean difference with the
between-seed noise ``2 * std(differences) / sqrt(seeds)``. A difference "holds" when it
exceeds its noise. Runs are sequential; under load a Ray start that times out is retried.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
import tomllib
from pathlib import Path

from t1ops.campaign.launch import run_campaign
from t1ops.config import parse_config
from t1ops.overrides import apply_overrides, parse_assignments

REPO = Path(__file__).resolve().parent.parent
RECIPES = {"dense": REPO / "examples" / "recipes" / "t1-report.toml",
           "binary": REPO / "examples" / "recipes" / "t1-report-binary.toml"}


def held_out(summary: dict) -> dict:
    """The last evaluation of a run: reward mean, its standard error, solved share, trials."""
    evals = summary.get("eval", [])
    if not evals:
        raise SystemExit("the run has no held-out evaluation: the recipes set eval.every_steps > 0")
    last = evals[-1]
    return {"step": last["step"], "reward": last["eval_reward_mean"], "sem": last["eval_reward_sem"],
            "solved": last["eval_solved_share"], "n": last["eval_num_trials"]}


def _run(cfg, out: Path, attempts: int = 6) -> Path:
    for attempt in range(attempts):  # a loaded host can miss Ray's fixed 30 s raylet start window
        try:
            return run_campaign(cfg, out_dir=str(out), show_progress=False)
        except Exception as err:  # noqa: BLE001 (Ray raises a bare Exception for this)
            if "timed out during startup" not in str(err) or attempt == attempts - 1:
                raise
            time.sleep(5)
    raise AssertionError("unreachable")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, help="override run.steps of both recipes")
    ap.add_argument("--eval-every", type=int, help="override eval.every_steps (the last step is always evaluated)")
    ap.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of both recipes (as `t1ops run --set`)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-reward-ablation-"))
    diffs = []
    for seed in args.seeds:
        arms = {}
        for arm, path in RECIPES.items():
            data = apply_overrides(tomllib.loads(path.read_text()), parse_assignments(args.set))
            cfg = parse_config(data, source=str(path))
            cfg.run.seed = seed
            if args.steps:
                cfg.run.steps = args.steps
            if args.eval_every:
                cfg.eval.every_steps = args.eval_every
            t0 = time.monotonic()
            run_dir = _run(cfg, out)
            arms[arm] = {**held_out(json.loads((run_dir / "summary.json").read_text())),
                         "minutes": (time.monotonic() - t0) / 60, "run": str(run_dir)}
        d, b = arms["dense"], arms["binary"]
        diff, noise = d["reward"] - b["reward"], 2 * math.sqrt(d["sem"] ** 2 + b["sem"] ** 2)
        diffs.append(diff)
        verdict = "holds" if abs(diff) > noise else "within noise"
        print(f"seed {seed}: held-out reward at step {d['step']}: dense {d['reward']:.3f} (solved {d['solved']:.0%}, "
              f"n {d['n']}) vs binary {b['reward']:.3f} (solved {b['solved']:.0%}, n {b['n']}): "
              f"dense - binary {diff:+.3f} vs eval noise {noise:.3f} -> {verdict}; "
              f"{d['minutes']:.1f} + {b['minutes']:.1f} min", flush=True)
    mean = statistics.fmean(diffs)
    spread = 2 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    print(f"over {len(diffs)} seeds: dense - binary {mean:+.3f}, between-seed noise {spread:.3f} "
          f"(2 x std / sqrt(seeds)) -> {'holds' if abs(mean) > spread else 'within noise'}")


if __name__ == "__main__":
    main()
