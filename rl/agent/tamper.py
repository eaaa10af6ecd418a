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

Issue #28: a module is judged in every form the import system accepts (``x.py``, ``x.pyc``,
``x.cpython-*.so``, a package or namespace dir, a link to any of them), and in the
directories on the verifier's import path on purpose (``rl/agent/verifier_env.py``) every
name of the standard library or the venv is protected. A git repository config in the
trial may hold only inert keys (:data:`GIT_SAFE_KEYS`); an executing key (a filter,
textconv, external diff, hook path, include, alias ...), a ``.git`` that is not a
directory, or a repository whose ``commondir``/``gitdir`` points git at a config elsewhere
(issue #51) is the ``tool-config`` event. Files are read with ``O_NOFOLLOW | O_NONBLOCK``
and must be regular (``rl/agent/bounded.py``).
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from rl.agent.bounded import BoundedReadError, read_regular, short
from rl.agent.verifier_env import module_name, protected_modules

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
                     # tests-modified | foreign-file | stale-ctrf | foreign-verdict | scan-failed |
                     # shadow-module | tool-config | ctrf-inconsistent | inconsistent-verdict |
                     # reward-out-of-range
    path: str
    detail: str = ""


def _shipped_same(rel: str, path: str, env_dir: Path) -> bool:
    """Whether the task's environment/ shipped this very file (same bytes, not a link)."""
    try:
        mine, _ = read_regular(path, 1 << 20)
        shipped, _ = read_regular(env_dir / rel, 1 << 20)
    except OSError:
        return False
    return mine == shipped


def scan_tree(trial_id: str, root: Path, env_dir: Path,
              import_dirs: tuple[str, ...] | list[str] = ()) -> list[TamperEvent]:
    """Walk ``root`` (the workspace) without recursion or following links; ``import_dirs``
    (relative to ``root``) are on the verifier's import path on purpose."""
    events: list[TamperEvent] = []
    for d in import_dirs:
        p = root / d
        if (p.is_symlink() or not p.is_dir()) and os.path.lexists(p):
            events.append(TamperEvent(trial_id, "shadow-module", str(p), f"{d!r} is on the verifier's "
                                      "import path and is not a plain directory"))
    protected_in = {os.path.normpath(d) for d in import_dirs}
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
            rel = os.path.relpath(entry.path, root)
            ev = _judge(trial_id, entry.name, entry.path, st, rel, env_dir)
            if ev is None:
                ev = _protected(trial_id, entry.name, entry.path, rel, env_dir, protected_in)
            if ev is None:
                ev = _git_config(trial_id, entry.name, entry.path, st, top)
            if ev is not None:
                events.append(ev)
    return events


def _protected(tid: str, name: str, path: str, rel: str, env_dir: Path,
               protected_in: set[str]) -> TamperEvent | None:
    if (os.path.dirname(rel) or ".") not in protected_in:
        return None
    module = module_name(name)
    if module in protected_modules() and not _shipped_same(rel, path, env_dir):
        return TamperEvent(tid, "shadow-module", path, f"{short(name, 80)!r} would shadow the verifier's "
                           f"{module!r} (its directory is on the verifier's import path)")
    return None


# git config keys that never make git run a program or read another config
GIT_SAFE_KEYS = re.compile(
    r"^(core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase|precomposeunicode|"
    r"symlinks|autocrlf|eol|safecrlf|quotepath|compression|abbrev|sharedrepository)|"
    r"extensions\.objectformat|remote\.[^\n]*\.(url|pushurl|fetch)|branch\.[^\n]*\.(remote|merge|rebase)|"
    r"user\.(name|email)|init\.defaultbranch|commit\.gpgsign|pull\.(rebase|ff)|push\.default|"
    r"fetch\.prune|gc\.auto|advice\.[a-z]+|color\.[a-z.]+|i18n\.[a-z]+|status\.[a-z]+|"
    r"diff\.(renames|algorithm|mnemonicprefix)|log\.[a-z]+)$")
_GIT_SECTION = re.compile(r'^\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(?:[#;].*)?$')
_GIT_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9-]*)\s*(?:=.*)?$")


def git_config_problem(text: str) -> str | None:
    """The first key of a git config that is not inert (:data:`GIT_SAFE_KEYS`), or a line
    that cannot be read as one: None when every key is inert."""
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        m = _GIT_SECTION.match(line)
        if m:
            section = m.group(1).lower() + (f".{m.group(2)}" if m.group(2) is not None else "")
            continue
        k = _GIT_KEY.match(line)
        if section is None or k is None or line.endswith("\\"):
            return f"unreadable line {short(line, 80)!r}"
        name, _, tail = section.partition(".")
        key = ".".join(filter(None, (name, tail, k.group(1).lower())))
        if not GIT_SAFE_KEYS.match(key):
            return f"key {short(key, 80)!r} may make git run a program or read another file"
    return None


def _git_config(tid: str, name: str, path: str, st: os.stat_result, top: str) -> TamperEvent | None:
    if name == ".git" and not stat.S_ISDIR(st.st_mode):
        return TamperEvent(tid, "tool-config", path, ".git is not a directory: git would follow it "
                           "to a repository elsewhere")
    is_repo = os.path.lexists(os.path.join(top, "HEAD"))
    if is_repo and name in ("commondir", "gitdir"):   # issue #51: git reads the config it points to
        return TamperEvent(tid, "tool-config", path, f"a repository's {name} file points git at a config "
                           "elsewhere; a repository in the trial must hold its own")
    if name not in ("config", "config.worktree") or not is_repo:
        return None
    try:
        data, _ = read_regular(path, 256 * 1024)
    except BoundedReadError as e:
        return TamperEvent(tid, "tool-config", path, f"a git config that cannot be read safely ({e})")
    problem = git_config_problem(data.decode("utf-8", errors="replace"))
    return None if problem is None else TamperEvent(tid, "tool-config", path, f"git config: {problem}")


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
    module = module_name(name)   # any form the import system accepts, a link included
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
