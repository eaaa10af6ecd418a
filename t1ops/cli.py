"""The ``t1ops`` command.

Each subcommand is a module exposing ``NAME``, ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``. They are found at start-up, so adding a command never
edits this file: modules in ``t1ops/commands/``, plus modules other packages
register under the ``t1ops.commands`` entry-point group. That is how the
``chaos`` package adds ``t1ops chaos`` without ``t1ops`` importing ``chaos``
(imports go one way: chaos -> t1ops -> rl).
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from importlib.metadata import entry_points

import t1ops.commands as commands_pkg
from t1ops import __version__
from t1ops.errors import T1OpsError

DESCRIPTION = """\
t1ops: run long-horizon agent RL campaigns (PPO with a critic, GRPO/DPPO) on
MoE models with guardrails on, check a cluster plan before spending GPU-days,
and prove every guardrail with the chaos harness.

Start with `t1ops doctor`, check a config with `t1ops run examples/tiny/campaign.toml --dry-run`,
then `t1ops run examples/tiny/campaign.toml`; `t1ops runs` lists runs (docs/getting-started.md).
"""


def _command_modules() -> list:
    mods = [importlib.import_module(f"t1ops.commands.{info.name}")
            for info in pkgutil.iter_modules(commands_pkg.__path__)]
    mods += [ep.load() for ep in entry_points(group="t1ops.commands")]
    return sorted(mods, key=lambda m: m.NAME)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1ops", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"t1ops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
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
        cause = getattr(err, "cause", None)   # raised in a Ray actor: Ray's wrapper holds the remote traceback
        err = cause if isinstance(cause, T1OpsError) else err
        print(f"t1ops {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `t1ops config | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
