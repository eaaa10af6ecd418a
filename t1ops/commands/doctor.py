"""`t1ops doctor`: host checks before a campaign."""
from __future__ import annotations

import argparse
import json
import sys

NAME = "doctor"
HELP = "check this host before a campaign (fd limits, RAM, OOM-kill visibility, timeouts)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print a JSON list of {name, status, detail}")
    p.add_argument("--reap", action="store_true",
                   help="first remove the containers, networks and volumes of dead runs "
                        "(container backend; docs/containers.md)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from t1ops.doctor import run_checks

    if args.reap:
        from rl.agent.container import runtime

        if runtime.available()[0]:
            gone = runtime.reap(only_dead=True)
            print(f"reaped {len(gone)}: " + ", ".join(f"{x.kind} {x.name} (run {x.run_id})" for x in gone)
                  if gone else "reaped 0: nothing of a dead run is left", file=sys.stderr)
    checks = run_checks()
    if args.json:
        print(json.dumps([c.to_dict() for c in checks], indent=2))
    else:
        t = Table(title="t1ops doctor")
        for col in ("check", "status", "detail"):
            t.add_column(col, overflow="fold")
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in checks:
            t.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", c.detail)
        Console().print(t)
    return 1 if any(c.status == "fail" for c in checks) else 0
