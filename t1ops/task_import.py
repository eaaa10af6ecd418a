"""Importing and checking task pools for `t1ops tasks` (docs/tasks.md).

Task archives are untrusted input (rl/agent/archive.py, rl/agent/ziparchive.py); a
task in the older Terminal-Bench layout is converted (rl/agent/tblegacy.py); a check
reports every problem of every task, the task.toml keys it ignores, and whether the
local environment backend can run it (rl/agent/environment.py).
"""
from __future__ import annotations

import base64
import binascii
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rl.agent import tblegacy
from rl.agent.archive import ArchiveLimits, extract_task_archive, extract_task_bytes
from rl.agent.bounded import short
from rl.agent.collected import collect
from rl.agent.environment import LOCAL, Environment
from rl.agent.tasks import inspect_task, links_leaving, load_task
from rl.errors import T1OpsError, TaskError, UnsafeArchiveError
from t1ops import telemetry

RECOMMENDED = ("solution/solve.sh", "environment")


@dataclass
class Report:
    """What one command did: per-item lines and whether anything was refused."""

    ok: list[dict] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)

    def add_refusal(self, source: str, err: Exception) -> None:
        member = getattr(err, "context", {}).get("member")
        self.refused.append({"source": short(source, 200), "error": type(err).__name__,
                             "member": None if member is None else short(member, 200),
                             "message": short(err, 600)})
        telemetry.event("tasks.refused", severity="error", source=source, error=type(err).__name__,
                        member=short(member, 200))


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
    """Convert an older Terminal-Bench layout, then keep the task only if it loads as a Harbor
    task; otherwise remove it and say why."""
    notes: list[str] = []
    try:
        if tblegacy.is_legacy(target):
            notes = tblegacy.convert(target)
        task = load_task(target)
    except (TaskError, OSError) as e:
        shutil.rmtree(target, ignore_errors=True)
        report.add_refusal(source, e)
        return
    report.ok.append({"source": source, "task": task.name, "path": str(target),
                      "tests_digest": task.tests_digest, "notes": notes,
                      "ignored": list(task.ignored)})


def _copy_dir(src: Path, into: Path, name: str | None) -> Path:
    """A task directory given to import: copied (links kept as links) only if no link in it
    leaves it and it holds no special file (rl/agent/tasks.py:links_leaving), so a refused
    directory leaves nothing in the pool."""
    leaving = links_leaving(src)
    if leaving:
        raise UnsafeArchiveError(f"{short(src, 120)}: {len(leaving)} entr(y/ies) would be followed out of "
                                 f"the task: {'; '.join(leaving[:3])}", archive=str(src)[:200],
                                 member=leaving[0][:200])
    target = into.resolve() / (name or src.resolve().name)
    if target.exists():
        raise UnsafeArchiveError(f"{src}: {target} already exists; remove it or import elsewhere",
                                 archive=str(src), member=None)
    into.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, target, symlinks=True)
    return target


def do_import(archives: list[Path], into: Path, limits: ArchiveLimits = ArchiveLimits(), *,
              name: str | None = None) -> Report:
    """Import each archive, dataset or task directory into ``into`` (module doc)."""
    report = Report()
    if name is not None and len(archives) != 1:
        report.add_refusal(",".join(map(str, archives)), TaskError(
            "--name names the task of a single archive; import the archives one at a time"))
        return report
    if name is not None:
        try:
            _safe_name(name, "--name")
        except UnsafeArchiveError as e:
            report.add_refusal("--name", e)
            return report
    for arc in archives:
        try:
            if arc.is_dir():
                _validated(_copy_dir(arc, into, name), report, str(arc))
            elif arc.suffix in (".jsonl", ".parquet") or arc.name.endswith(".json-lines"):
                for row_name, blob in _rows(arc):
                    where = f"{arc}[{row_name}]"
                    try:
                        target = extract_task_bytes(blob, into, name=_safe_name(row_name, where),
                                                    archive=where, limits=limits)
                    except UnsafeArchiveError as e:
                        report.add_refusal(where, e)
                        continue
                    _validated(target, report, where)
            else:
                _validated(extract_task_archive(arc, into, name=name, limits=limits), report, str(arc))
        except (T1OpsError, OSError) as e:
            report.add_refusal(str(arc), e)
    return report


def task_dirs(root: Path) -> list[Path]:
    """``root`` itself if it is a task directory, else its task subdirectories."""
    root = root.resolve()
    marks = ("task.toml", "instruction.md", "task.yaml")
    if any((root / m).exists() for m in marks):
        return [root]
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def do_check(root: Path, *, allow_internet: bool = False, backend: str = "local") -> Report:
    """Every problem of every task, the keys each ignores, and whether it runs locally."""
    report = Report()
    dirs = task_dirs(root)
    if not dirs:
        report.add_refusal(str(root), TaskError(f"{root}: no task directories found", path=str(root)))
    for d in dirs:
        check = inspect_task(d)
        if check.task is None:
            for problem in check.problems:
                report.add_refusal(str(d), TaskError(problem, path=str(d)))
            continue
        env = backend_named(backend).check(check.task, allow_internet=allow_internet)
        uncounted = [f"{node}: its parameter sets cannot be counted statically; the verdict counts it as "
                     "one test (docs/sandbox.md, issue #51)"
                     for node, n in collect(check.task.tests_snapshot).functions.items() if n is None]
        missing = [m for m in RECOMMENDED if not (d / m).exists()]
        report.ok.append({"source": str(d), "task": check.task.name, "family": check.task.family,
                          "num_test_files": len(check.task.tests_sha256),
                          "missing_optional": missing, "ignored": list(check.ignored),
                          "runs_locally": env.runs_locally, "needs": list(env.needs),
                          "notes": [*env.notes, *uncounted], "workdir": env.workdir})
    return report


def backend_named(name: str) -> Environment:
    """The environment backend a task is checked and run with: "container" or the local one."""
    if name == "container":
        from rl.agent.container.backend import CONTAINER
        return CONTAINER
    return LOCAL
