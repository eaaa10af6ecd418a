"""`t1ops config`: show the schema or validate campaign files."""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "config"
HELP = "print the campaign config schema, or validate TOML files against it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", type=Path, help="campaign TOML files to validate")


def run(args: argparse.Namespace) -> int:
    from t1ops.config import describe, load_toml

    if not args.files:
        for key, default, desc in describe():
            print(f"{key:40s} {default:>14s}  {desc}")
        return 0
    for f in args.files:
        load_toml(f)  # raises ConfigError naming the key
        print(f"{f}: ok")
    return 0
