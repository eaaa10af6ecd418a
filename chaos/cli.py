"""`t1ops chaos list|run`: the chaos harness from the command line."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from chaos import harness

NAME = "chaos"
HELP = "list or run chaos scenarios (one per documented failure)"
DESCRIPTION = """\
Each scenario injects one documented production failure for real (a killed
process, a stalled socket, a lowered rlimit, a stale file) and checks that the
guardrail catches it. Runbooks: runbooks/<id>.md.

  t1ops chaos list [--json]
  t1ops chaos run dead-engine [--json]
  t1ops chaos run --all [--json] [--markdown FILE] [--json-out FILE]
  t1ops chaos index [--write]      the runbook index (runbooks/README.md)
  t1ops chaos schedule --seed N [--faults 5] [--steps 4] [--config FILE]
                                   a seeded random fault schedule against a short
                                   real campaign; the seed replays it exactly
  t1ops chaos soak [ID...] --repeat 5 --load 1 [--json-out FILE]
                                   the suite N times under K busy background cores:
                                   pass rate and detection-time spread per scenario
  t1ops chaos verify-recovery [--faults engine-kill,coordinator-kill,trainer-kill,critic-skip] [--combined]
                                   the tiny campaign (deterministic configuration, 4 steps)
                                   clean and with each fault plus recovery: per-step rewards,
                                   losses and the final actor checksum must be identical
                                   (docs/determinism.md); exit 1 on any difference
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
    rn.add_argument("--record-durations", action="store_true",
                    help="write each scenario's wall seconds into chaos/durations.json (the typical durations "
                         "`t1ops chaos list` shows), with this host's CPU count and load")
    ix = sub.add_parser("index", help="print the runbook index generated from runbooks/*.md")
    ix.add_argument("--write", action="store_true", help="write it to runbooks/README.md instead")
    sc = sub.add_parser("schedule", help="run a seeded random fault schedule against a short campaign")
    sc.add_argument("--seed", type=int, required=True, help="schedule seed (printed on failure; replays exactly)")
    sc.add_argument("--faults", type=int, default=5, help="number of faults to inject (default 5)")
    sc.add_argument("--steps", type=int, default=4, help="campaign steps (default 4)")
    sc.add_argument("--config", type=Path, default=Path("examples/tiny/campaign.toml"),
                    help="base campaign file (default: the tiny campaign)")
    sc.add_argument("--out", type=Path, default=Path("runs"), help="parent of the run directory")
    sk = sub.add_parser("soak", help="run scenarios N times under background CPU load; pass rate per scenario")
    sk.add_argument("ids", nargs="*", metavar="ID", help="scenario ids (default: every registered scenario)")
    sk.add_argument("--repeat", type=int, default=5, help="rounds over the scenarios (default 5)")
    sk.add_argument("--load", type=int, default=1, help="busy background processes, one core each (default 1)")
    sk.add_argument("--json-out", type=Path, help="also write per-scenario results as JSON here")
    vr = sub.add_parser("verify-recovery",
                        help="a run with a fault plus recovery must equal the clean run, bit for bit")
    vr.add_argument("--faults", default="engine-kill,coordinator-kill,trainer-kill",
                    help="comma-separated faults (default: the three kills; critic-skip: the "
                         "critic's saves skipped, the run resumed)")
    vr.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: a temp dir)")
    vr.add_argument("--combined", action="store_true",
                    help="all faults in one run (engine-kill at step 2, coordinator-kill at 3, trainer-kill at 4)")
    vr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                    help="one more override of the deterministic configuration (e.g. rollout.seed_requests=false)")


def run(args: argparse.Namespace) -> int:
    from chaos import report

    scenarios = harness.discover()
    if args.action == "list":
        typical = report.typical_durations()
        rows = [{"id": s.id, "title": s.title, "runbook": s.runbook, "typical_s": typical.get(s.id)}
                for s in scenarios.values()]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            report.print_list(rows)
        return 0
    if args.action == "index":
        return _index(args, scenarios)
    if args.action == "schedule":
        return _schedule(args)
    if args.action == "soak":
        return _soak(args, scenarios)
    if args.action == "verify-recovery":
        return _verify_recovery(args)
    ids = list(scenarios) if args.all else args.ids
    if not ids:
        print("name scenario ids or pass --all (see `t1ops chaos list`)", file=sys.stderr)
        return 2
    named = scenarios if args.all else harness.discover(include_private=True)  # `_` ids: only by name
    unknown = [i for i in ids if i not in named]
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
        args.json_out.write_text(json.dumps(payload, indent=2, default=_jsonable))
    if args.markdown:
        args.markdown.write_text(report.markdown(results, _runbook_prefix(args.markdown)))
    if args.record_durations:
        report.record_durations(results)
    if args.json:
        print(json.dumps(payload, indent=2, default=_jsonable))
    else:
        report.print_table(results)
    return 0 if all(r.passed for r in results) else 1


def _jsonable(value):
    """Scenario details may hold numpy scalars or paths: numbers stay numbers, the rest is text."""
    return value.item() if hasattr(value, "item") else str(value)


def _runbook_prefix(markdown_path: Path) -> str:
    """Relative path from the Markdown file's folder to the repository root, so its links resolve."""
    root = harness.RUNBOOK_DIR.parent
    rel = os.path.relpath(root, markdown_path.resolve().parent)
    return "" if rel == "." else rel.replace(os.sep, "/") + "/"


def _index(args: argparse.Namespace, scenarios: dict) -> int:
    from chaos import runbooks

    text = runbooks.index_markdown(harness.RUNBOOK_DIR, {sid: s.title for sid, s in scenarios.items()})
    if args.write:
        path = harness.RUNBOOK_DIR / runbooks.INDEX_NAME
        path.write_text(text)
        print(f"wrote {path} ({len(runbooks.runbook_ids())} runbooks)")
    else:
        print(text, end="")
    return 0


def _schedule(args: argparse.Namespace) -> int:
    from chaos.schedule import run_schedule
    from t1ops.config import load_toml

    cfg = load_toml(args.config)
    res = run_schedule(args.seed, args.faults, cfg, str(args.out), num_steps=args.steps)
    print(json.dumps(res, indent=2, default=str))
    verdicts = {v["id"]: v for v in res["invariants"]["faults"]}
    print(f"\nseed {args.seed}: {len(res['fired'])}/{len(res['schedule'])} faults fired", file=sys.stderr)
    for f in res["fired"]:
        v = verdicts.get(f["id"], {})
        rule = "must catch" if v.get("must_catch") else "must absorb"
        proof = ", ".join(v.get("evidence") or v.get("wrongly_named") or []) or "-"
        print(f"  {f['id']} {f['kind']:<13} hit {f['work']} ({'in flight' if f['in_flight'] else 'IDLE'}); "
              f"{rule}: {'ok' if v.get('ok') else 'FAILED'} [{proof}]", file=sys.stderr)
    for k, ok in res["invariants"].items():
        if k not in ("faults", "detail"):
            print(f"  {'ok ' if ok else 'FAIL'} {k}", file=sys.stderr)
    if not res["passed"]:
        print(f"fault schedule seed={args.seed} FAILED its invariants; replay with "
              f"`t1ops chaos schedule --seed {args.seed} --faults {args.faults} --steps {args.steps}`",
              file=sys.stderr)
        return 1
    return 0


def _soak(args: argparse.Namespace, scenarios: dict) -> int:
    from chaos.soak import soak, table_lines

    ids = args.ids or list(scenarios)
    unknown = [i for i in ids if i not in harness.discover(include_private=True)]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(scenarios)}", file=sys.stderr)
        return 2
    try:
        books = soak(ids, args.repeat, args.load)
    except ValueError as err:
        print(f"t1ops chaos soak: {err}", file=sys.stderr)
        return 2
    print("\n".join(table_lines(books, args.repeat, args.load)))
    if args.json_out:
        args.json_out.write_text(json.dumps([b.to_dict() for b in books], indent=2))
    return 0 if all(b.pass_rate == 1.0 for b in books) else 1


def _verify_recovery(args: argparse.Namespace) -> int:
    import tempfile
    import time

    from chaos.recovery import DETERMINISTIC, FAULTS, KNOWN, verify

    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = [f for f in faults if f not in KNOWN]
    if unknown:
        print(f"unknown fault(s): {', '.join(unknown)}; known: {', '.join(KNOWN)}", file=sys.stderr)
        return 2
    if args.combined and set(faults) - set(FAULTS):
        print(f"--combined takes {', '.join(FAULTS)}; run {', '.join(sorted(set(faults) - set(FAULTS)))} "
              "without --combined", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="t1ops-recovery-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        ok, _, text = verify(out, faults, DETERMINISTIC + list(args.overrides), combined=args.combined)
    print(text)
    verdict = "all runs identical to the clean run" if ok else \
        "FAILED: a run differs from the clean run or a fault did not fire"
    print(f"verify-recovery: {verdict} ({time.monotonic() - t0:.0f} s)")
    return 0 if ok else 1
