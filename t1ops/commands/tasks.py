"""`t1ops tasks import|check`: bring untrusted task archives in safely, validate Harbor layout."""
from __future__ import annotations

import argparse
import base64
import binascii
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rl.agent.archive import ArchiveLimits, extract_task_archive, extract_task_bytes
from rl.agent.tasks import load_task
from rl.errors import T1OpsError, TaskError, UnsafeArchiveError
from t1ops import telemetry

NAME = "tasks"
HELP = "import task archives safely (tar.gz, JSON lines, Parquet) and check Harbor task dirs"
DESCRIPTION = """\
Task archives are untrusted input. `import` refuses absolute paths, '..',
links leaving the task root, device files and size/member-count bombs, names
the offending member, and writes nothing outside --into. Dataset files hold
one task per row, {"path": NAME, "task_binary": <gzip tar>} (the SkyRL/Harbor
dataset shape); in JSON lines task_binary is base64. Parquet needs pyarrow.

  t1ops tasks import task.tar.gz more.tar.gz --into pool/
  t1ops tasks import dataset.jsonl --into pool/
  t1ops tasks check pool/            (a pool dir or one task dir)

Both exit non-zero on any refusal or layout error.
"""
RECOMMENDED = ("solution/solve.sh", "environment")


@dataclass
class Report:
    """What one command did: per-item lines and whether anything was refused."""

    ok: list[dict] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)

    def add_refusal(self, source: str, err: Exception) -> None:
        member = getattr(err, "context", {}).get("member")
        self.refused.append({"source": source, "error": type(err).__name__, "member": member,
                             "message": str(err)})
        telemetry.event("tasks.refused", severity="error", source=source, error=type(err).__name__,
                        member=str(member))


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    imp = sub.add_parser("import", help="extract task archives or dataset rows into a directory")
    imp.add_argument("archives", nargs="+", type=Path, metavar="ARCHIVE",
                     help=".tar.gz / .tgz task archive, .jsonl dataset, or .parquet dataset")
    imp.add_argument("--into", type=Path, required=True, help="destination pool directory")
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


def _rows(path: Path) -> Iterator[tuple[str, bytes]]:
    """(name, task_binary) per dataset row; malformed rows raise UnsafeArchiveError naming the row."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise TaskError(f"{path}: reading Parquet needs pyarrow, which is not installed "
                            "(pip install pyarrow), or convert the dataset to JSON lines",
                            path=str(path)) from e
        table = pq.read_table(path, columns=["path", "task_binary"])
        for i, row in enumerate(table.to_pylist()):
            yield _row_fields(row, f"{path}:{i}", raw_bytes=True)
        return
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UnsafeArchiveError(f"{path}:{i}: not JSON ({e})", archive=str(path),
                                         member=f"line {i}") from e
            yield _row_fields(row, f"{path}:{i}", raw_bytes=False)


def _row_fields(row: object, where: str, *, raw_bytes: bool) -> tuple[str, bytes]:
    if not isinstance(row, dict) or not isinstance(row.get("path"), str):
        raise UnsafeArchiveError(f"{where}: a row needs string 'path' and 'task_binary'",
                                 archive=where, member=None)
    blob = row.get("task_binary")
    if raw_bytes and isinstance(blob, bytes):
        return row["path"], blob
    if not isinstance(blob, str):
        raise UnsafeArchiveError(f"{where}: task_binary must be base64 text in JSON lines",
                                 archive=where, member=row["path"])
    try:
        return row["path"], base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError) as e:
        raise UnsafeArchiveError(f"{where}: task_binary is not valid base64 ({e})", archive=where,
                                 member=row["path"]) from e


def _safe_name(name: str, where: str) -> str:
    if not name or "/" in name or "\\" in name or name in (".", "..") or name.startswith(".") \
            or "\x00" in name:
        raise UnsafeArchiveError(f"{where}: row path {name!r} is not a plain task name", archive=where,
                                 member=name)
    return name


def _validated(target: Path, report: Report, source: str) -> None:
    """Keep an extracted task only if it loads as a Harbor task; otherwise remove it."""
    try:
        task = load_task(target)
    except TaskError as e:
        shutil.rmtree(target, ignore_errors=True)
        report.add_refusal(source, e)
        return
    report.ok.append({"source": source, "task": task.name, "path": str(target),
                      "tests_digest": task.tests_digest})


def do_import(archives: list[Path], into: Path, limits: ArchiveLimits = ArchiveLimits()) -> Report:
    report = Report()
    for arc in archives:
        try:
            if arc.suffix in (".jsonl", ".parquet") or arc.name.endswith(".json-lines"):
                for name, blob in _rows(arc):
                    where = f"{arc}[{name}]"
                    try:
                        target = extract_task_bytes(blob, into, name=_safe_name(name, where),
                                                    archive=where, limits=limits)
                    except UnsafeArchiveError as e:
                        report.add_refusal(where, e)
                        continue
                    _validated(target, report, where)
            else:
                _validated(extract_task_archive(arc, into, limits=limits), report, str(arc))
        except (T1OpsError, OSError) as e:
            report.add_refusal(str(arc), e)
    return report


def do_check(root: Path) -> Report:
    report = Report()
    dirs = [root] if (root / "task.toml").exists() or (root / "instruction.md").exists() else \
        sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if root.is_dir() else []
    if not dirs:
        report.add_refusal(str(root), TaskError(f"{root}: no task directories found", path=str(root)))
    for d in dirs:
        try:
            task = load_task(d)
        except (TaskError, OSError) as e:
            report.add_refusal(str(d), e)
            continue
        missing = [m for m in RECOMMENDED if not (d / m).exists()]
        report.ok.append({"source": str(d), "task": task.name, "family": task.family,
                          "num_test_files": len(task.tests_sha256), "missing_optional": missing})
    return report


def run(args: argparse.Namespace) -> int:
    if args.action == "import":
        limits = ArchiveLimits(max_members=args.max_members,
                               max_total_bytes=int(args.max_total_mb * 2**20),
                               max_member_bytes=int(args.max_member_mb * 2**20))
        report = do_import(args.archives, args.into, limits)
    else:
        report = do_check(args.dir)
    if args.json:
        print(json.dumps({"ok": report.ok, "refused": report.refused}, indent=2))
    else:
        for row in report.ok:
            extra = f" (missing optional: {', '.join(row['missing_optional'])})" \
                if row.get("missing_optional") else ""
            print(f"ok       {row['task']:<32} {row.get('path', row['source'])}{extra}")
        for row in report.refused:
            print(f"REFUSED  {row['source']}: {row['message']}", file=sys.stderr)
        print(f"{len(report.ok)} ok, {len(report.refused)} refused", file=sys.stderr)
    return 1 if report.refused else 0
