"""`t1ops chaos list|run`: the chaos harness from the command line."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "chaos"
HELP = "list or run chaos scenarios (one per documented failure)"
DESCRIPTION = """\
Each scenario injects one documented production failure for real (a killed
process, a stalled socket, a lowered rlimit, a stale file) and checks that the
guardrail catches it. Runbooks: runbooks/<id>.md.

  t1ops chaos list [--json]
  t1ops chaos run dead-engine [--json]
  t1ops chaos run --all [--json] [--markdown FILE] [--json-out FILE]
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="list registered scenarios")
    ls.add_argument("--json", action="store_true", help="print JSON")
    rn = sub.add_parser("run", help="run scenarios and report")
    rn.add_argument("ids", nargs="*", metavar="ID", help="scenario ids (see `t1ops chaos list`)")
    rn.add_argument("--all", action="store_true", help="run every registered scenario")
    rn.add_argument("--json", action="store_true", help="print results as JSON")
    rn.add_argument("--markdown", type=Path, help="also write the report table as Markdown here")
    rn.add_argument("--json-out", type=Path, help="also write the results as JSON here")


def run(args: argparse.Namespace) -> int:
    from chaos import harness, report

    scenarios = harness.discover()
    if args.action == "list":
        rows = [{"id": s.id, "title": s.title, "runbook": s.runbook} for s in scenarios.values()]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            report.print_list(rows)
        return 0
    ids = list(scenarios) if args.all else args.ids
    if not ids:
        print("name scenario ids or pass --all (see `t1ops chaos list`)", file=sys.stderr)
        return 2
    unknown = [i for i in ids if i not in scenarios]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(scenarios)}", file=sys.stderr)
        return 2
    results = []
    for sid in ids:
        if not args.json:
            print(f"running {sid} ...", file=sys.stderr, flush=True)
        results.append(harness.run_scenario(sid))
    payload = [r.to_dict() for r in results]
    if args.json_out:
        args.json_out.write_text(json.dumps(payload, indent=2))
    if args.markdown:
        args.markdown.write_text(report.markdown(results))
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        report.print_table(results)
    return 0 if all(r.passed for r in results) else 1
