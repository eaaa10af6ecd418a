"""`t1ops explain ID`: a failure id's guard, chaos scenario, runbook and governing config keys."""
from __future__ import annotations

import argparse

NAME = "explain"
HELP = "explain a failure id of the catalogue (guard, scenario, runbook, config keys) or a config key"
DESCRIPTION = """\
One hop from a failure id (docs/failures.md) to everything about it:

  t1ops explain dead-engine          # guard module, `t1ops chaos run` scenario, runbook, config keys
  t1ops explain engine.failure_threshold   # a config key: its default and the failures it governs
  t1ops explain --list               # every catalogue id
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("item", nargs="?", help="a failure id or a dotted config key")
    p.add_argument("--list", action="store_true", help="list every catalogue id")


def run(args: argparse.Namespace) -> int:
    from t1ops.explain import entries, explain

    if args.list or not args.item:
        for e in entries().values():
            print(f"{e.id:26s} {e.failure}")
        return 0
    print(explain(args.item))
    return 0
