"""`t1ops config`: show the schema or validate campaign files."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "config"
HELP = "print the campaign config schema, or validate TOML files against it (and the files they name)"
DESCRIPTION = """\
With no file: print every key of a campaign config, its default and what it does.
With files: validate each one (keys, types, ranges, cross-section rules) and the files and
directories it names (task pools, a plan, the harness); every file is reported, exit 1 if any fails.
Relative paths in a file resolve against that file's directory (--set: the working directory).

  t1ops config                                   # the schema
  t1ops config examples/tiny/campaign.toml --set rollout.batch_size=16
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", type=Path, help="campaign TOML files to validate")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override one key in every file, as `t1ops run --set` does (repeatable)")


def print_schema(model=None) -> None:
    from t1ops.config import CampaignConfig, describe

    for key, default, desc in describe(model or CampaignConfig):
        print(f"{key:40s} {default:>14s}  {desc}")


def run(args: argparse.Namespace) -> int:
    from t1ops.config import load_config
    from t1ops.errors import ConfigError
    from t1ops.overrides import parse_assignments

    if not args.files:
        if args.overrides:
            raise ConfigError("--set needs a config file: t1ops config FILE --set KEY=VALUE", key="--set")
        print_schema()
        return 0
    pairs = parse_assignments(args.overrides)
    failed = 0
    for f in args.files:
        try:
            loaded = load_config(f, overrides=pairs)
            missing = loaded.missing_files()
            if missing:
                raise ConfigError("paths that do not exist:\n  " + "\n  ".join(missing), path=str(f))
        except ConfigError as err:
            failed += 1
            print(f"{f}: FAILED\n  " + str(err).replace("\n", "\n  "), file=sys.stderr)
            continue
        named = ", ".join(f"{k} {p.path}" for k, p in loaded.paths.items()
                          if k != "harness.program_dir" or loaded.config.rollout.agent == "command")
        print(f"{f}: ok" + (f" ({named})" if named else ""))
    if len(args.files) > 1:
        print(f"{len(args.files) - failed}/{len(args.files)} config files ok", file=sys.stderr if failed else sys.stdout)
    return 1 if failed else 0
