"""`t1ops preflight PLAN`: predict per-GPU memory and check a cluster plan before launch."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "preflight"
HELP = "check a cluster plan (TOML) against the calibrated memory model before spending GPU-days"
DESCRIPTION = ("Reads a plan file (see examples/plans/), predicts per-GPU memory by term for the critic-only, "
               "joint-critic and joint-actor phases, and runs the structural checks of the T1 report "
               "(expert-parallel identity, TP > 2, DP = 1, max-tokens-per-GPU, host RAM). "
               "Exit code 0: ok; 1: the plan is refused.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", type=Path, nargs="?",
                   help="plan TOML file, e.g. examples/plans/qwen35-122b-128gpu-cp4.toml (a cluster plan, not a "
                        "campaign config: those go to `t1ops run` and `t1ops config`)")
    p.add_argument("--schema", action="store_true", help="print every key of a plan file, its default and meaning")
    p.add_argument("--model", type=Path, metavar="DIR", default=None,
                   help="take the model from a Hugging Face checkpoint's config.json (qwen3_5_moe, qwen3_moe) instead of "
                        "the plan's [model]; docs/model.md")
    p.add_argument("--json", action="store_true",
                   help='print {"verdict", "findings": [{"id", "severity", "message"}], "memory": {...}}')


def run(args: argparse.Namespace) -> int:
    from t1ops.errors import ConfigError
    from t1ops.preflight import check_plan, load_plan, render

    if args.schema:
        from t1ops.commands.config import print_schema
        from t1ops.preflight.plan import Plan

        print_schema(Plan)
        return 0
    if args.plan is None:
        raise ConfigError("give a plan file, e.g. t1ops preflight examples/plans/qwen35-122b-128gpu-cp4.toml "
                          "(its keys: t1ops preflight --schema)", key="plan")
    plan = load_plan(args.plan)
    if args.model is not None:
        from t1ops.preflight.from_checkpoint import model_shape

        plan = type(plan).model_validate({**plan.model_dump(), "model": model_shape(args.model).model_dump()})
    report = check_plan(plan, name=args.plan.stem)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        render(report)
    return 0 if report.verdict == "ok" else 1
