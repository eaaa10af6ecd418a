"""The verifier's environment: what its programs may load, and from where (docs/sandbox.md).

Rule (issue #28, class 1): the workspace is *data* to the verifier. Nothing the agent wrote
is loaded as code by the verifier's interpreter or tools unless the task's own tests ask
for it on purpose, and even then it can never stand in for a module of the standard
library or of the verifier's venv:

- ``PYTHONSAFEPATH=1``: no interpreter puts its cwd (``-m``/``-c``) or script dir first on
  ``sys.path``; ``PYTHONNOUSERSITE=1``, no bytecode written. A task that needs the old
  behaviour says so with ``[verifier.env] PYTHONSAFEPATH = ""``.
- Variables that make a program load code (``LD_*``, ``PYTHON*``, ``BASH_ENV``, ``GIT_*``,
  ``PERL5*``, ``NODE_*`` ... :data:`CODE_LOADING`) come only from ``[verifier.env]`` (the
  task author's declared intent), never from the image's ``ENV`` or ``[environment.env]``
  (which describe the agent's world).
- Every directory of the workspace that is on the verifier's import path on purpose (a
  ``PYTHONPATH`` entry, or the workdir itself when the tests put it on ``sys.path``) is
  scanned: an entry there named like a protected module (:func:`protected_modules`) in
  any form the import system accepts is the ``shadow-module`` tamper event.
- git runs with no system or global config and with every executing key pinned by
  ``GIT_CONFIG_COUNT`` (:data:`GIT_OVERRIDES`); a repository config in the workspace may
  hold only inert keys (``rl/agent/tamper.py``), anything else is ``tool-config``.
"""
from __future__ import annotations

import functools
import importlib.machinery
import os
import re
import sys
import sysconfig
from pathlib import PurePosixPath
from typing import Mapping

CODE_LOADING = re.compile(
    r"^(LD_\w*|PYTHON\w*|BASH_ENV|ENV|BASH_FUNC_.*|SHELLOPTS|BASHOPTS|PS4|PROMPT_COMMAND|IFS|CDPATH|"
    r"GIT_\w*|PERL5\w*|PERLLIB|RUBY\w*|GEM_\w*|NODE_\w*|JAVA_TOOL_OPTIONS|_JAVA_OPTIONS|CLASSPATH|"
    r"GCONV_PATH|LOCPATH|NLSPATH|HOSTALIASES|MALLOC_\w*|GLIBC_TUNABLES|PAGER|EDITOR|VISUAL|"
    r"LESSOPEN|LESSCLOSE|MANPAGER|PYTEST_\w*|COV_CORE_\w*|TERMINFO\w*)$")

GIT_OVERRIDES = (
    ("core.hooksPath", "/dev/null"), ("core.fsmonitor", "false"), ("core.pager", "cat"),
    ("core.editor", "true"), ("sequence.editor", "true"), ("core.sshCommand", "false"),
    ("core.askPass", "true"), ("credential.helper", ""), ("safe.bareRepository", "explicit"),
    ("protocol.ext.allow", "never"), ("gpg.program", "false"), ("core.gitProxy", "false"),
)


def git_env() -> dict[str, str]:
    """git with no system/global config, no prompt, and its executing keys pinned."""
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ATTR_NOSYSTEM": "1",
           "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "PAGER": "cat",
           "GIT_CONFIG_COUNT": str(len(GIT_OVERRIDES))}
    for i, (key, value) in enumerate(GIT_OVERRIDES):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


# the trial's directories the agent can write besides its workdir (docs/sandbox.md "What a trial sees")
AGENT_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/logs/agent")
_PATH_TOKEN = re.compile(r"[\s:;,=\"']+")


# the running interpreter's trees (its venv's bin/ holds the verifier's pytest): the sandbox binds them
# read-only into each trial (docs/sandbox.md), so no agent writes them wherever the checkout lies
_INTERPRETER_DIRS = tuple(sorted({os.path.normpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix)}))


def agent_writable(path: str, workdir: str) -> bool:
    """Whether ``path`` lies in a directory the agent could write (its workdir, /tmp, ...);
    a relative path is the cwd (the workdir) to whoever reads it."""
    if not path.startswith("/"):
        return True
    p = os.path.normpath(path)
    if any(p == r or p.startswith(r + "/") for r in _INTERPRETER_DIRS):
        return False  # bound read-only into every trial, even from a checkout under /tmp (a CI clone)
    return any(p == r or p.startswith(r.rstrip("/") + "/") for r in (workdir, *AGENT_WRITABLE))


def names_agent_path(value: str, workdir: str) -> bool:
    """Whether any absolute path in ``value`` (a PATH-like list, ``--opt=/x``, ``a /x``) lies
    where the agent could write."""
    return any(t.startswith("/") and agent_writable(t, workdir) for t in _PATH_TOKEN.split(value))


def verifier_search_path(path: str, workdir: str) -> str:
    """``path`` less every entry the agent could write (or that is relative): the verifier's
    programs come only from directories of the image or the host that no trial writes."""
    return ":".join(d for d in path.split(":") if d and not agent_writable(d, workdir))


def task_env_for_verifier(image_and_task_env: Mapping[str, str], workdir: str) -> dict[str, str]:
    """The image's ENV and ``[environment.env]`` without the variables that load code and
    without any that names a path the agent could write (issue #51: the image's
    ``VIRTUAL_ENV=/app/.venv`` is the agent's world, not the verifier's)."""
    return {k: v for k, v in image_and_task_env.items()
            if not CODE_LOADING.match(k) and not names_agent_path(v, workdir)}


# modules the interpreter imports by itself at start-up, from anywhere on sys.path, in any form
STARTUP_MODULES = ("sitecustomize", "usercustomize")


@functools.lru_cache(maxsize=1)
def protected_modules() -> frozenset[str]:
    """Top-level names the verifier's interpreter resolves from the standard library or its
    venv: a workspace entry on the import path with one of these names is a forgery."""
    names = set(sys.stdlib_module_names) | set(sys.builtin_module_names) | set(STARTUP_MODULES)
    for key in ("purelib", "platlib"):
        try:
            entries = os.listdir(sysconfig.get_paths()[key])
        except OSError:
            continue
        names |= {m for m in map(module_name, entries) if m}
    return frozenset(names)


_SUFFIXES = tuple(sorted(importlib.machinery.all_suffixes(), key=len, reverse=True))


def module_name(entry: str) -> str | None:
    """The top-level module an import-path entry provides (``x.py``, ``x.pyc``, ``x.*.so``,
    a package or namespace dir ``x``), or None. ``.dist-info`` and dotted names provide none."""
    for suffix in _SUFFIXES:
        if entry.endswith(suffix) and len(entry) > len(suffix):
            stem = entry[: -len(suffix)]
            return stem.split(".", 1)[0] if stem.split(".", 1)[0].isidentifier() else None
    return entry if entry.isidentifier() else None


def import_dirs(env: Mapping[str, str], workdir: str, tests: Mapping[str, bytes]) -> list[str]:
    """Workspace directories (relative to the workdir, "." for itself) on the verifier's
    import path: its ``PYTHONPATH`` entries inside the workdir, and the workdir itself when
    safe-path mode is off or the task's tests name it or touch ``sys.path``/``pythonpath``."""
    out: list[str] = []
    root = PurePosixPath(workdir)
    for entry in filter(None, env.get("PYTHONPATH", "").split(":")):
        p = PurePosixPath(entry) if entry.startswith("/") else root / entry
        p = PurePosixPath(os.path.normpath(str(p)))
        if p == root or root in p.parents:
            out.append(str(p.relative_to(root)) or ".")
    on_purpose = any(workdir.encode() in data or b"sys.path" in data or b"pythonpath" in data.lower()
                     for data in tests.values())
    if not env.get("PYTHONSAFEPATH") or on_purpose:
        out.append(".")
    return list(dict.fromkeys(out))
