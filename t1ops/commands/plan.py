"""`t1ops plan simulate`: predict a campaign's step time, idle GPUs and staleness before launch."""
from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

NAME = "plan"
HELP = "simulate a campaign's step loop (step time, idle GPUs, staleness) before launch"
DESCRIPTION = """\
t1ops plan simulate: a discrete-event model of the step loop (docs/scale.md).

  t1ops plan simulate --from RUN_DIR                      # fit a finished run, predict it
  t1ops plan simulate --from RUN_DIR --set pipeline.mode="fully_async" --set rollout.batch_size=64
  t1ops plan simulate --from RUN_DIR --campaign other.toml # the fitted costs, another campaign's config
  t1ops plan simulate --config examples/simulate/t1-report-128gpu.toml  # hand-given distributions
  t1ops plan simulate --schema        # every key of a simulation file (--config, --set)

Prints the predicted step time and its split, trajectories/s, the idle GPU share of each side,
staleness (fully_async) and the skimmed tail; --json for the numbers, --plot PNG for a figure.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="plan_command", metavar="SUBCOMMAND", required=True)
    s = sub.add_parser("simulate", help="predict step time, idle GPUs and staleness", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--from", dest="run_dir", type=Path, help="fit trials and costs from this finished run directory")
    s.add_argument("--campaign", type=Path, help="take batch, concurrency, mode ... from this campaign config "
                                                 "(TOML or a run's config.json) instead of the fitted run's")
    s.add_argument("--config", type=Path, help="simulation TOML (t1ops.plan.inputs.SimConfig); its keys override")
    s.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one key")
    s.add_argument("--json", action="store_true", help="print the prediction as JSON")
    s.add_argument("--schema", action="store_true", help="print every key of a simulation config and exit")
    s.add_argument("--plot", type=Path, help="write the figure here (PNG)")


def _campaign_dict(path: Path) -> dict:
    from t1ops.config import load_toml

    if path.suffix == ".json":
        return json.loads(path.read_text())
    return load_toml(path).model_dump()


def _sim_toml(path: Path) -> dict:
    from t1ops.errors import ConfigError

    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"simulation config {path} does not exist (resolved to {path.absolute()}); "
                          "examples: examples/simulate/", path=str(path)) from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"simulation config {path} is not valid TOML: {err}", path=str(path)) from None


def run(args: argparse.Namespace) -> int:
    from t1ops.errors import ConfigError
    from t1ops.plan.fit import apply_sets, build_config, fit_run, merge, sim_config_from_campaign
    from t1ops.plan.inputs import Workload
    from t1ops.plan.report import plot, render, summarise
    from t1ops.plan.simulate import simulate

    if args.schema:
        from t1ops.commands.config import print_schema
        from t1ops.plan.inputs import SimConfig

        print_schema(SimConfig)
        return 0
    if args.run_dir is None and args.config is None:
        raise ConfigError("nothing to simulate: pass --from RUN_DIR (measured trials) and/or --config SIM.toml "
                          "(hand-given distributions)", key="--from")
    data, workload, notes = {}, Workload(), []
    if args.run_dir is not None:
        data, workload, notes = fit_run(args.run_dir)
    if args.campaign is not None:
        data = merge(data, sim_config_from_campaign(_campaign_dict(args.campaign)))
        notes.append(f"launch config from {args.campaign}")
    if args.config is not None:
        data = merge(data, _sim_toml(args.config))
        notes.append(f"simulation config {args.config}")
    data = apply_sets(data, args.set)
    notes += [f"--set {s}" for s in args.set]
    cfg = build_config(data, source="the simulation inputs (" + ", ".join(notes) + ")" if notes else "--set")
    if cfg.trials is not None and not workload.samples:
        workload = Workload(hand=cfg.trials)
    summary = summarise(cfg, simulate(cfg, workload))
    if args.plot is not None:
        plot(summary, args.plot)
        notes.append(f"plot: {args.plot}")
    print(json.dumps({"prediction": summary, "inputs": cfg.model_dump(), "notes": notes}, indent=2) if args.json
          else render(summary, notes))
    return 0
