"""The tamper scan: everything in a finished trial that only a forger would put there.

Iterative (no recursion limit: a 1,100-deep tree is just a long walk), links are never
followed, and it covers every path the pinned pytest could read from the agent's side:
the workspace (the verifier's cwd). The verifier's pytest runs with an explicit config
(``-c``), ``--rootdir``/``--confcutdir`` at ``/tests`` and no plugin autoload, inside a
root that holds nothing else the agent wrote; so a planted config is inert, and finding
one voids the trial anyway. A module that would shadow pytest's own under
``python -m pytest`` (the cwd leads ``sys.path``) is voided the same way. A file the task's own ``environment/``
shipped with the same bytes is not a forgery. If the scan itself fails (an unreadable
entry, a path too long, too many entries) that is a ``scan-failed`` event: a recorded
verdict with reward 0, never a crash.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

PYTEST_CONFIGS = {"conftest.py": "conftest", "pytest.ini": "pytest-config",
                  "sitecustomize.py": "pytest-config", "usercustomize.py": "pytest-config"}
SHADOW_NAMES = {"pytest", "py.test", "python", "python3", "bash"}
# modules the verifier's pytest imports: `python -m pytest` run from a workspace directory
# would import a planted copy first (the cwd leads sys.path)
SHADOW_MODULES = {"pytest", "_pytest", "pluggy", "ctrf", "py", "iniconfig"}
MAX_ENTRIES = 200_000


@dataclass(frozen=True)
class TamperEvent:
    """One forgery attempt (or a scan that could not finish) found in a trial."""

    trial_id: str
    kind: str        # precreated-ctrf | conftest | pytest-config | shadow-exec | precreated-dir |
                     # tests-modified | foreign-file | stale-ctrf | foreign-verdict | scan-failed
    path: str
    detail: str = ""


def _shipped_same(rel: str, path: str, env_dir: Path) -> bool:
    """Whether the task's environment/ shipped this very file (same bytes, not a link)."""
    shipped = env_dir / rel
    if not shipped.is_file() or shipped.is_symlink():
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        return f.read(1 << 20) == shipped.read_bytes()[: 1 << 20]


def scan_tree(trial_id: str, root: Path, env_dir: Path) -> list[TamperEvent]:
    """Walk ``root`` (the workspace) without recursion or following links."""
    events: list[TamperEvent] = []
    stack, seen = [str(root)], 0
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError as e:
            return events + [TamperEvent(trial_id, "scan-failed", top, f"cannot list: {e}")]
        for entry in entries:
            seen += 1
            if seen > MAX_ENTRIES:
                return events + [TamperEvent(trial_id, "scan-failed", str(root),
                                             f"more than {MAX_ENTRIES} entries")]
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as e:
                return events + [TamperEvent(trial_id, "scan-failed", entry.path, str(e))]
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
            ev = _judge(trial_id, entry.name, entry.path, st, os.path.relpath(entry.path, root), env_dir)
            if ev is not None:
                events.append(ev)
    return events


def _judge(tid: str, name: str, path: str, st: os.stat_result, rel: str,
           env_dir: Path) -> TamperEvent | None:
    lname = name.lower()
    if lname.endswith(".json") and "ctrf" in lname:
        return TamperEvent(tid, "precreated-ctrf", path, "a CTRF report existed before the verifier ran")
    if name in PYTEST_CONFIGS and not _shipped_same(rel, path, env_dir):
        return TamperEvent(tid, PYTEST_CONFIGS[name], path,
                           "python/pytest would load it if it sat on their path")
    if (name in SHADOW_NAMES and stat.S_ISREG(st.st_mode) and st.st_mode & 0o111
            and not _shipped_same(rel, path, env_dir)):
        return TamperEvent(tid, "shadow-exec", path, f"executable named {name!r} could shadow the verifier's tools")
    module = name[:-3] if name.endswith(".py") and stat.S_ISREG(st.st_mode) else (
        name if stat.S_ISDIR(st.st_mode) else None)
    if module in SHADOW_MODULES and not _shipped_same(rel, path, env_dir):
        return TamperEvent(tid, "shadow-module", path,
                           f"{name!r} would shadow the verifier's {module!r} under `python -m pytest`")
    return None


def scan_trial_dir(trial_id: str, trial_dir: Path, allowed: set[str]) -> list[TamperEvent]:
    """Entries of the trial dir itself that nobody but the verifier may create."""
    events = []
    for entry in sorted(os.listdir(trial_dir)):
        path = trial_dir / entry
        if entry in ("tests", "verifier"):
            events.append(TamperEvent(trial_id, "precreated-dir", str(path),
                                      f"{entry}/ existed before the verifier ran"))
        elif entry not in allowed:
            events.append(TamperEvent(trial_id, "foreign-file", str(path), "outside the workspace"))
    return events
