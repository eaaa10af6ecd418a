"""A configured program runs as the trial's agent, inside its sandbox, against the endpoint.

``rollout.agent = "command"``: instead of t1ops's own loop, the worker opens a
:class:`~rl.harness.session.HarnessSession` for the trial on its endpoint and
runs the harness's ``argv`` as one sandboxed command (the trial's uid, limits,
private network namespace, and what is left of the trial's time budget). The
harness finds everything in its environment:

==========================  ==========================================================
``OPENAI_BASE_URL``         ``http://t1ops/s/<session>/v1`` (the session is in the path)
``OPENAI_API_KEY``          the session name (an unguessable token) as well
``T1OPS_OPENAI_SOCKET``     the endpoint's unix socket: connect there (httpx ``uds=``)
``T1OPS_INSTRUCTION``       the task's instruction
``T1OPS_WORKSPACE``         the workspace (also the command's cwd)
``T1OPS_MAX_TURNS``         the trial's model-call budget
``T1OPS_MCP_SERVERS``       JSON list of ``{"name", "argv"}`` stdio MCP servers (may be ``[]``)
``PYTHONPATH``              where ``openai``/``mcp`` live, when ``{python}`` is not this interpreter
==========================  ==========================================================

Why a unix socket: a trial runs in fresh namespaces without network (no route
to any host port), but a path socket is reachable from any network namespace
once its directory is bound into the trial's private root (at
:data:`JAIL_SOCKET_DIR`); the socket file is 0666 in a 0711 directory and a
session is only reachable by its unguessable name. ``argv`` placeholders: ``{python}`` (an
interpreter the sandbox uid can execute, see :func:`harness_python`),
``{harness}`` (the harness program directory as the trial sees it; nothing else of the
repository exists in a trial).
"""
from __future__ import annotations

import json
import os
import stat
import sys
import sysconfig
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rl.agent.sandbox import ExecResult, run_jailed
from rl.errors import InputError, SandboxError, TitoError

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class HarnessSettings:
    """What ``rollout.agent = "command"`` runs (fields follow ``t1ops.config.HarnessConfig``)."""

    argv: tuple[str, ...]
    program_dir: str = "examples/harness"
    max_corrections: int = 2
    mcp_servers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    command: bool = True          # False: only the MCP servers are used (by the builtin agent)


@dataclass
class HarnessOutcome:
    """What a harness trial produced (the fields of ``rl.agent.loop.Episode`` the campaign reports)."""

    chunks: list
    num_turns: int
    end_reason: str
    exit_code: int | None
    exec_reason: str
    stats: dict = field(default_factory=dict)
    stdout_tail: str = ""
    stderr_tail: str = ""

    @property
    def parse_failures(self) -> int:
        return int(self.stats.get("parse_failures", 0))

    @property
    def generate_s(self) -> float:
        return float(self.stats.get("generate_s", 0.0))


def _world_reachable(path: str) -> bool:
    """Whether every ancestor directory of ``path`` is searchable by others (an unprivileged uid)."""
    p = Path(path).resolve()
    for d in [*reversed(p.parents)]:
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(p).st_mode & stat.S_IXOTH)


def harness_python() -> tuple[str, str | None]:
    """(interpreter, PYTHONPATH) a sandbox uid can run with this environment's packages.

    This interpreter when its path is world-searchable; else the system's
    ``python3.X`` of the same version with this environment's site-packages on
    ``PYTHONPATH`` (a venv on a private home directory is common)."""
    if _world_reachable(sys.executable):
        return sys.executable, None
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for cand in (f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.path.exists(cand) and _world_reachable(cand):
            paths = sysconfig.get_paths()
            return cand, os.pathsep.join(dict.fromkeys([paths["purelib"], paths["platlib"]]))
    raise InputError(f"no {version} that an unprivileged uid can execute: {sys.executable} sits under a "
                     "private directory and there is no system interpreter of the same version; install "
                     f"{version} system-wide or make the environment world-readable", interpreter=sys.executable)


def expand_argv(argv: tuple[str, ...], *, python: str, harness: str) -> list[str]:
    if not argv:
        raise InputError("harness.argv is empty: set the program the command agent runs", argument="harness.argv")
    return [a.replace("{python}", python).replace("{harness}", harness) for a in argv]


def harness_env(*, session_url: str, session_id: str, socket_path: str, instruction: str, workspace: str,
                max_turns: int, settings: HarnessSettings, pythonpath: str | None,
                mcp_servers: list[tuple[str, list[str]]] = ()) -> dict[str, str]:
    env = {"OPENAI_BASE_URL": session_url, "OPENAI_API_KEY": session_id, "T1OPS_OPENAI_SOCKET": socket_path,
           "T1OPS_INSTRUCTION": instruction, "T1OPS_WORKSPACE": workspace, "T1OPS_MAX_TURNS": str(max_turns),
           "T1OPS_MCP_SERVERS": json.dumps([{"name": n, "argv": list(a)} for n, a in mcp_servers]),
           "PYTHONDONTWRITEBYTECODE": "1", **dict(settings.env)}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def outcome(session, res: Any) -> HarnessOutcome:
    """Close ``session`` and judge the run: an error the session kept (missing routing, a dead
    engine pool, cancellation) is re-raised; no model call at all is an error, never an empty trial."""
    session.close()
    if session.fatal is not None:  # e.g. MissingRoutingError: the rollout aborts, never a quiet episode end
        raise session.fatal
    chunks = session.finish()
    stats = session.stats()
    if not chunks:
        raise TitoError(f"session {session.sample_id}: the harness made no model call (exit {res.exit_code}, "
                        f"{res.reason}); stderr tail: {res.stderr[-400:]!r}", sample=session.sample_id)
    end = stats["end_reason"]
    if end == "done" and res.reason not in ("ok", "exit_nonzero"):
        end = "budget_exhausted" if res.reason in ("timeout", "budget_exhausted") else res.reason
    elif end == "done" and res.exit_code != 0:
        end = "harness_error"
    return HarnessOutcome(chunks=chunks, num_turns=stats["model_calls"], end_reason=end, exit_code=res.exit_code,
                          exec_reason=res.reason, stats=stats, stdout_tail=res.stdout[-400:],
                          stderr_tail=res.stderr[-400:])


JAIL_SOCKET_DIR = "/run/t1ops-openai"     # where the endpoint's socket dir appears in a namespaced trial
JAIL_HARNESS_DIR = "/opt/t1ops-harness"   # where the harness program dir appears in a namespaced trial


def run_in_trial(trial, argv: list[str], env: dict[str, str], *, socket_dir: Path, harness_dir: Path):
    """Run ``argv`` as the trial's agent: its uid, jail, cgroup, network policy and remaining budget.

    The trial's private root (``rl.agent.sandbox``) shows only declared paths, so
    the endpoint's socket directory is bound in read-write at :data:`JAIL_SOCKET_DIR`
    and the harness program directory read-only at :data:`JAIL_HARNESS_DIR`.
    """
    if trial.finished:
        raise SandboxError(f"trial {trial.trial_id} is finished; the verifier owns it now", trial_id=trial.trial_id)
    remaining = trial.remaining_s
    if remaining <= 0:
        return ExecResult("", f"agent budget of {trial.budget.timeout_s:g}s is spent", None, "budget_exhausted", 0.0)
    view = trial._agent_view()
    view = replace(view, ro=view.ro + ((JAIL_HARNESS_DIR, harness_dir),),
                   rw=view.rw + ((JAIL_SOCKET_DIR, socket_dir),))
    trial.num_commands += 1
    return run_jailed(argv, view, env={**trial.agent_env(), **env}, uid=trial.uid, limits=trial.limits,
                      cgroup=trial.cgroup, timeout_s=remaining, log_dir=trial.dir / "logs", network=trial.network,
                      secrets=trial.secrets, budget_cut=True)


def trial_paths(trial, *, socket_path: Path) -> tuple[str, str, str]:
    """(socket path, harness dir, workspace) as the harness process sees them."""
    return f"{JAIL_SOCKET_DIR}/{socket_path.name}", JAIL_HARNESS_DIR, trial.workdir


def resolve_program_dir(program_dir: str) -> Path:
    path = Path(program_dir)
    path = path if path.is_absolute() else REPO / path
    if not path.is_dir():
        raise InputError(f"harness.program_dir {program_dir!r} is not a directory (resolved to {path})",
                         argument="harness.program_dir")
    return path
