"""Learning evidence on held-out tasks: last vs warm-started eval reward, beside the eval noise.

    python bench/bench_learning.py [--seeds 0 1 2] [--steps N] [--config FILE] [--out DIR]

Runs the tiny campaign once per seed (sequentially) and reads each run's
held-out evaluations with `t1ops compare` (t1ops/compare.py, docs/campaign.md
"Learning evidence"): per run, the held-out reward of the eval at step 0 (the
warm-started weights) and of the last eval, their difference, and the noise of
that difference, ``2 * sqrt(se_0^2 + se_last^2)`` with ``se`` the standard
error of a mean over that eval's per-trial rewards. Held-out instances of the
trained families and the held-out family are reported separately; learning
"holds" on a seed when its trained-family instances rise by more than the
noise. The seed changes the warm start's demonstrations, the task order and
the sampling; the config is otherwise the shipped one. Prints `t1ops compare`'s
table and writes compare.png into the runs' directory.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from t1ops.campaign.launch import run_campaign
from t1ops.compare import HELD_OUT_FAMILIES, compare, learning_of
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, help="override run.steps")
    ap.add_argument("--config", type=Path, default=REPO / "examples" / "tiny" / "campaign.toml")
    ap.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    args = ap.parse_args()
    base = load_toml(args.config)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-learning-"))
    runs, holds = [], []
    for seed in args.seeds:
        cfg = base.model_copy(deep=True)
        cfg.run.seed = seed
        if args.steps:
            cfg.run.steps = args.steps
        t0 = time.monotonic()
        run_dir = run_campaign(cfg, out_dir=str(out), show_progress=False)
        runs.append(run_dir)
        for r in learning_of(run_dir):
            p0, p1 = r.points[0], r.points[-1]
            print(f"seed {seed} {r.group}: held-out reward {p0.mean:.3f} (step {p0.step}, n {p0.n}) -> "
                  f"{p1.mean:.3f} (step {p1.step}, n {p1.n}): {r.gain:+.3f} vs noise {r.noise:.3f} -> {r.verdict}",
                  flush=True)
            if r.group != HELD_OUT_FAMILIES:
                holds.append(r.holds)
        print(f"seed {seed}: {(time.monotonic() - t0) / 60:.1f} min; {run_dir}", flush=True)
    lines, _ = compare(runs, out / "compare.png")
    print("\n".join(["", "t1ops compare " + " ".join(str(r) for r in runs), *lines]))
    print(f"learning beyond eval noise on {sum(holds)}/{len(holds)} seeds (held-out instances of the trained "
          "families; noise = 2 x standard error of the difference of the two eval means)")


if __name__ == "__main__":
    main()
