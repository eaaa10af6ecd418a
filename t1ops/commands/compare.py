"""`t1ops compare RUN_DIR...`: held-out reward at start and end per config, beside its noise."""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "compare"
HELP = "held-out reward at the start and end of runs (seeds or configs), with the noise of the difference"
DESCRIPTION = """\
Reads each RUN_DIR's summary.json and prints, per config (runs whose configs
differ only in run.seed / run.name / run.out_dir share one) and per run, the
held-out reward of the first evaluation (step 0, the warm start) and of the
last, their difference and its noise: 2 x the standard error of the
difference, from the per-trial rewards. Held-out instances of trained families
and held-out families (no transfer expected) are reported separately. Draws
compare.png (--out). See docs/campaign.md, "Learning evidence".

  t1ops compare runs/tiny-*
  t1ops compare runs/a runs/b --out /tmp/ab.png

With --check it exits 1 unless every run's trained-family instances (or,
without families, its held-out tasks) rise beyond the noise.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories (summary.json)")
    p.add_argument("--out", type=Path, default=Path("compare.png"), help="the figure (default %(default)s)")
    p.add_argument("--no-plot", action="store_true", help="print only")
    p.add_argument("--check", action="store_true", help="exit 1 unless every run rises beyond the noise")


def run(args: argparse.Namespace) -> int:
    from t1ops.compare import HELD_OUT_FAMILIES, compare

    lines, configs = compare(args.run_dirs, None if args.no_plot else args.out)
    print("\n".join(lines))
    main = [r for _, rows in configs for r in rows if r.group != HELD_OUT_FAMILIES]
    return 1 if args.check and not (main and all(r.holds for r in main)) else 0
