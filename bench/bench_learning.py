"""Learning evidence on held-out tasks: final vs warm-started eval reward, beside the eval noise.

    python bench/bench_learning.py [--seeds 0 1 2] [--steps N] [--config FILE]

Runs the tiny campaign once per seed (sequentially) and reads each run's
held-out evaluation (summary.json "eval", docs/campaign.md): the eval at step 0
(the warm-started weights) and the eval at the last step. For each seed it
prints both eval rewards, the improvement, and the eval noise of that
difference, measured from the same run: ``2 * sqrt(sem_0^2 + sem_last^2)``,
where ``sem`` is the standard error of the eval reward mean over that eval's
trials (per-trial rewards' std / sqrt(n)). The improvement "holds" when it
exceeds that noise (about a 95% interval for independent trials). The seed
changes the warm start's demonstrations, the task split, the task order and
the sampling; the config is otherwise the shipped one.
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

from t1ops.campaign.launch import run_campaign
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parent.parent


def learning_of(summary: dict) -> dict:
    """Warm-started vs final eval of one run, and the noise of their difference."""
    evals = summary.get("eval", [])
    if len(evals) < 2:
        raise SystemExit("the run has fewer than 2 evaluations: set eval.every_steps > 0 in the config")
    first, last = evals[0], evals[-1]
    noise = 2 * math.sqrt(first["eval_reward_sem"] ** 2 + last["eval_reward_sem"] ** 2)
    gain = last["eval_reward_mean"] - first["eval_reward_mean"]
    return {"step0": first["eval_reward_mean"], "last_step": last["step"], "last": last["eval_reward_mean"],
            "gain": gain, "noise": noise, "holds": gain > noise, "n0": first["eval_num_trials"],
            "n_last": last["eval_num_trials"], "solved0": first["eval_solved_share"],
            "solved_last": last["eval_solved_share"]}


def _verdict(r: dict) -> str:
    if r["holds"]:
        return "holds (improvement beyond noise)"
    return "a drop beyond noise" if -r["gain"] > r["noise"] else "within noise"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, help="override run.steps")
    ap.add_argument("--config", type=Path, default=REPO / "examples" / "tiny" / "campaign.toml")
    ap.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    args = ap.parse_args()
    base = load_toml(args.config)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-learning-"))
    rows = []
    for seed in args.seeds:
        cfg = base.model_copy(deep=True)
        cfg.run.seed = seed
        if args.steps:
            cfg.run.steps = args.steps
        t0 = time.monotonic()
        run_dir = run_campaign(cfg, out_dir=str(out), show_progress=False)
        r = learning_of(json.loads((run_dir / "summary.json").read_text()))
        r.update(seed=seed, minutes=(time.monotonic() - t0) / 60, run=str(run_dir))
        rows.append(r)
        print(f"seed {seed}: eval reward {r['step0']:.3f} (step 0, n {r['n0']}) -> {r['last']:.3f} "
              f"(step {r['last_step']}, n {r['n_last']}): improvement {r['gain']:+.3f} vs noise {r['noise']:.3f} "
              f"-> {_verdict(r)}; solved {r['solved0']:.0%} -> "
              f"{r['solved_last']:.0%}; {r['minutes']:.1f} min; {run_dir}", flush=True)
    held = sum(r["holds"] for r in rows)
    print(f"learning beyond eval noise on {held}/{len(rows)} seeds "
          f"(noise = 2 x standard error of the difference of the two eval means)")


if __name__ == "__main__":
    main()
