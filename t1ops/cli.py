"""The ``t1ops`` command.

Each subcommand is a module in ``t1ops/commands/`` exposing ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; they are found at start-up,
so adding a command never edits this file.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import t1ops.commands as commands_pkg
from t1ops import __version__
from t1ops.errors import T1OpsError

DESCRIPTION = """\
t1ops: run long-horizon agent RL campaigns (PPO with a critic, GRPO/DPPO) on
MoE models with guardrails on, check a cluster plan before spending GPU-days,
and prove every guardrail with the chaos harness.

Start with `t1ops doctor`, then `t1ops run examples/tiny/campaign.toml`.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1ops", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"t1ops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"t1ops.commands.{info.name}")
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except T1OpsError as err:
        print(f"t1ops {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
