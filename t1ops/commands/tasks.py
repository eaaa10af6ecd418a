"""`t1ops tasks import|check|run|generate`: bring untrusted task archives in safely, check Harbor
tasks, run them with their reference solution, generate them from families (docs/tasks.md)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rl.agent.archive import ArchiveLimits
from t1ops.task_import import Report, do_check, do_import

NAME = "tasks"
HELP = ("import task archives safely (tar.gz, zip, JSON lines, Parquet), check and run Harbor tasks, "
        "generate task families")
DESCRIPTION = """\
Task archives are untrusted input. `import` refuses absolute paths, '..',
links leaving the task root, device files and size/member-count bombs, names
the offending member, and writes nothing outside --into. An archive without a
single top folder needs --name. A task in the older Terminal-Bench layout
(task.yaml, run-tests.sh, solution.sh) is converted to the Harbor layout. Dataset
files hold one task per row, {"path": NAME, "task_binary": <gzip tar>} (the
SkyRL/Harbor dataset shape); in JSON lines task_binary is base64. Parquet needs pyarrow.

  t1ops tasks import task.tar.gz task.zip old-task-dir/ --into pool/
  t1ops tasks import flat.zip --name my-task --into pool/
  t1ops tasks import dataset.jsonl --into pool/
  t1ops tasks check pool/            (every problem of every task; ignored keys;
                                      runs locally / needs a container runtime)
  t1ops tasks run pool/ --oracle --json   (reference solution, then the verifier)
  t1ops tasks generate sum grep --instances 16 --seed 0 --into train/
  t1ops tasks generate sum grep --instances 6 --start 16 --seed 0 --into heldout/
                                      (instances 16..21 of the same stream: never
                                       a training task; families: t1ops tasks generate --list)

import and check exit non-zero on any refusal or layout error; run exits non-zero
when a task could not be run (it needs a container runtime, network, ...).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    imp = sub.add_parser("import", help="extract task archives or dataset rows into a directory")
    imp.add_argument("archives", nargs="+", type=Path, metavar="ARCHIVE",
                     help=".tar.gz / .tgz / .zip task archive, a task directory, .jsonl dataset, "
                          "or .parquet dataset")
    imp.add_argument("--into", type=Path, required=True, help="destination pool directory")
    imp.add_argument("--name", help="task name for a single archive without a top folder")
    imp.add_argument("--json", action="store_true", help="print the report as JSON")
    imp.add_argument("--max-members", type=int, default=ArchiveLimits.max_members,
                     help="refuse an archive with more members (default %(default)s)")
    imp.add_argument("--max-total-mb", type=float, default=ArchiveLimits.max_total_bytes / 2**20,
                     help="refuse an archive whose members add up to more (default %(default)s)")
    imp.add_argument("--max-member-mb", type=float, default=ArchiveLimits.max_member_bytes / 2**20,
                     help="refuse a single member larger than this (default %(default)s)")
    chk = sub.add_parser("check", help="validate Harbor layout of a task dir or a pool of them")
    chk.add_argument("dir", type=Path, help="a task directory or a directory of tasks")
    chk.add_argument("--json", action="store_true", help="print the report as JSON")
    chk.add_argument("--allow-internet", action="store_true",
                     help="tasks declaring allow_internet = true count as runnable")
    chk.add_argument("--backend", choices=("local", "container"), default="local",
                     help="check against this environment backend (container: FROM names, "
                          "stand-ins, runtime)")
    run = sub.add_parser("run", help="run tasks with their reference solution (or no agent action) "
                                     "and the verifier; print reward, source, passed/total, reason")
    run.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                     help="a task directory or a pool directory (every task in it)")
    run.add_argument("--oracle", action="store_true",
                     help="run solution/solve.sh first (else the agent does nothing)")
    run.add_argument("--json", action="store_true", help="print a JSON list, one object per task")
    run.add_argument("--scale", type=float, default=20.0, metavar="S",
                     help="reward = passed tests / S (default 20, the report's; use your campaign's "
                          "rollout.reward_scale, e.g. 4 for the tiny families)")
    run.add_argument("--allow-internet", action="store_true",
                     help="give the network to tasks that declare allow_internet = true")
    run.add_argument("--backend", choices=("local", "container"), default="local",
                     help="local: namespaces on this host (default); container: build each task's "
                          "Dockerfile and run it in a container (docs/containers.md)")
    run.add_argument("--trials-root", type=Path, default=None,
                     help="where trial directories go (default: a temporary directory)")
    _add_generate(sub)


def _add_generate(sub) -> None:
    from t1ops.taskgen import FAMILIES

    gen = sub.add_parser("generate", help="write Harbor tasks from parameterized families "
                                          f"({', '.join(FAMILIES)})")
    gen.add_argument("families", nargs="*", metavar="FAMILY", help="families to generate (see --list)")
    gen.add_argument("--instances", type=int, default=8, help="instances per family (default %(default)s)")
    gen.add_argument("--seed", type=int, default=0, help="the instance stream's seed (default %(default)s)")
    gen.add_argument("--start", type=int, default=0,
                     help="first instance index: --start N continues a pool of N instances with new ones")
    gen.add_argument("--into", type=Path, help="destination pool directory")
    gen.add_argument("--list", action="store_true", help="list the families and exit")


def _generate(args: argparse.Namespace) -> int:
    from t1ops.taskgen import FAMILIES, generate, instances

    if args.list or not args.families:
        for name in FAMILIES:  # each family with its first instance as an example
            print(f"{name:<8} e.g. {instances(name, 1, 0)[0][1].instruction}")
        if not args.list:
            print("t1ops tasks generate: name at least one FAMILY (above)", file=sys.stderr)
        return 0 if args.list else 2
    if args.into is None:
        print("t1ops tasks generate: --into POOL is required", file=sys.stderr)
        return 2
    written = generate(args.families, args.instances, args.seed, args.into, start=args.start)
    for d in written:
        print(d)
    print(f"{len(written)} tasks written to {args.into} (families {', '.join(dict.fromkeys(args.families))}, "
          f"instances {args.start}..{args.start + args.instances - 1}, seed {args.seed})", file=sys.stderr)
    return 0


def _print_report(report: Report, *, checked: bool, backend: str = "local") -> None:
    runs = "runs locally" if backend == "local" else f"runs on the {backend} backend"
    for row in report.ok:
        extra = f" (missing optional: {', '.join(row['missing_optional'])})" \
            if row.get("missing_optional") else ""
        where = row["path"] if not checked else runs if row["runs_locally"] \
            else "; ".join(row["needs"])
        print(f"ok       {row['task']:<28} {where}{extra}")
        for note in row.get("notes", []):
            print(f"           note: {note}")
        if row.get("ignored"):
            print(f"           ignored: {', '.join(row['ignored'])}")
    for row in report.refused:
        text = row["message"] if row["message"].startswith(row["source"]) \
            else f"{row['source']}: {row['message']}"
        print(f"REFUSED  {text}", file=sys.stderr)
    sys.stdout.flush()
    local = sum(bool(r.get("runs_locally")) for r in report.ok)
    split = f" ({local} run locally, {len(report.ok) - local} need more)" if checked else ""
    print(f"{len(report.ok)} ok{split}, {len(report.refused)} refused", file=sys.stderr)


def _run_tasks(args: argparse.Namespace) -> int:
    from t1ops.errors import ConfigError
    from t1ops.task_runs import print_rows, run_paths

    if not args.scale > 0:
        raise ConfigError(f"--scale must be > 0, got {args.scale}", key="--scale")
    rows = run_paths(args.paths, oracle=args.oracle, allow_internet=args.allow_internet, scale=args.scale,
                     trials_root=args.trials_root, backend=args.backend)
    print_rows(rows, as_json=args.json)
    return 1 if any(r["reward"] is None for r in rows) else 0


def run(args: argparse.Namespace) -> int:
    if args.action == "run":
        return _run_tasks(args)
    if args.action == "generate":
        return _generate(args)
    if args.action == "import":
        limits = ArchiveLimits(max_members=args.max_members,
                               max_total_bytes=int(args.max_total_mb * 2**20),
                               max_member_bytes=int(args.max_member_mb * 2**20))
        report = do_import(args.archives, args.into, limits, name=args.name)
    else:
        report = do_check(args.dir, allow_internet=args.allow_internet, backend=args.backend)
    if args.json:
        print(json.dumps({"ok": report.ok, "refused": report.refused}, indent=2))
    else:
        _print_report(report, checked=args.action == "check", backend=getattr(args, "backend", "local"))
    return 1 if report.refused else 0
