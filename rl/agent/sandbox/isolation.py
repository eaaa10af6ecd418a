"""What isolation this host gives a trial, probed once by really building a jail.

Levels, weakest to strongest (``t1ops run`` refuses a level below ``sandbox.isolation``):

- ``none``: tasks run as the invoking (non-root) user with per-process rlimits; only for a
  developer's non-root machine, and only when asked for. Never used as root.
- ``namespaces``: per-trial uid, no capabilities, ``no_new_privs``, fresh mount / PID / IPC /
  UTS / network namespaces per command, a size-limited tmpfs per trial; limits per process
  (rlimits) because no per-trial cgroup could be made.
- ``strict``: ``namespaces`` plus a per-trial cgroup (memory incl. tmpfs, pids, cpu).
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rl.agent.sandbox import cgroup as cgroups
from rl.agent.sandbox.jail import View, interpreter_dirs, run_jailed
from rl.agent.sandbox.limits import Limits
from rl.errors import SandboxError

log = logging.getLogger("rl.agent.sandbox")

LEVELS = ("none", "namespaces", "strict")
AGENT_UID = 1_000_000            # per-trial agent uids: AGENT_UID + randbelow(UID_SPAN)
VERIFIER_UID = 1_100_000_000     # per-trial verifier uids: VERIFIER_UID + randbelow(UID_SPAN)
UID_SPAN = 1_000_000_000
PROBE_UID = 65533
NAMESPACES = ("mount", "pid", "net", "ipc", "uts")


@dataclass(frozen=True)
class Isolation:
    """The probed isolation: the level and, for each part, what holds or why not."""

    level: str                    # none | namespaces | strict
    uid_drop: bool
    uid_reason: str
    namespaces: tuple[str, ...]
    jail_reason: str
    cgroup: bool
    cgroup_reason: str

    @property
    def network_isolated(self) -> bool:
        return "net" in self.namespaces

    @property
    def limits_reason(self) -> str:
        return (self.cgroup_reason if self.cgroup else
                f"rlimit fallback (RLIMIT_AS/RLIMIT_NPROC per process): {self.cgroup_reason}")

    def at_least(self, required: str) -> bool:
        return LEVELS.index(self.level) >= LEVELS.index(required)

    def to_dict(self) -> dict:
        return {"level": self.level, "uid_drop": self.uid_drop, "uid_reason": self.uid_reason,
                "namespaces": list(self.namespaces), "jail_reason": self.jail_reason,
                "cgroup": self.cgroup, "limits": self.limits_reason}


def _probe_jail() -> str | None:
    """None when a jail runs the interpreter with pytest and pytest-json-ctrf as an
    unprivileged uid with no capabilities; else the reason, naming the fix."""
    with tempfile.TemporaryDirectory(prefix="t1ops-jail-probe-") as d:
        root, app = Path(d) / "root", Path(d) / "app"
        root.mkdir()
        app.mkdir()
        os.chown(app, PROBE_UID, PROBE_UID)
        code = ("import os, pytest, ctrf; s = open('/proc/self/status').read(); "
                "print(os.getuid(), 'CapEff:\\t0000000000000000' in s, sum(p.isdigit() for p in os.listdir('/proc')) <= 3)")
        try:
            res = run_jailed([sys.executable, "-c", code],
                             View(root, rw=(("/app", app),)),
                             env={"PATH": "/usr/bin:/bin"}, uid=PROBE_UID,
                             limits=Limits(cpu_s=60, memory_mb=2048), cgroup=None, timeout_s=60,
                             log_dir=Path(d) / "logs", network=False)
        except SandboxError as e:
            return str(e)
    if res.reason != "ok" or res.stdout.split() != [str(PROBE_UID), "True", "True"]:
        return (f"uid {PROBE_UID} could not run {sys.executable} with pytest and "
                f"pytest-json-ctrf inside the jail (exit {res.exit_code}: {(res.stdout + res.stderr).strip()[-300:]}); "
                f"bound read-only: {interpreter_dirs()}. Install pytest-json-ctrf into that "
                "environment, or run from a venv whose interpreter is world-readable")
    return None


@functools.lru_cache(maxsize=1)
def probe_isolation() -> Isolation:
    """Probe once per process: uid drop + namespaces (by building a jail) and the cgroup."""
    if os.geteuid() != 0:
        reason = (f"not root (euid {os.geteuid()}): cannot drop to per-trial uids or build the "
                  "trial's namespaces; run as root, or set sandbox.isolation = \"none\" to accept "
                  "tasks running as this user")
        return Isolation("none", False, reason, (), reason, False, "not root")
    problem = _probe_jail()
    if problem is not None:
        log.error("sandbox: %s", problem)
        return Isolation("none", False, problem, (), problem, False, "no jail")
    support, cg_reason = cgroups.probe()
    if support is None:
        log.warning("sandbox: %s", cg_reason)
    return Isolation("strict" if support else "namespaces", True,
                     f"agent uid >= {AGENT_UID}, verifier uid >= {VERIFIER_UID}, one of each per "
                     "trial; no capabilities, no_new_privs", NAMESPACES,
                     "fresh mount/pid/net/ipc/uts namespaces per command; read-only host view "
                     "(/usr, /etc, interpreter, venv); private /tmp /var/tmp /dev/shm on the "
                     "trial's tmpfs", support is not None, cg_reason)


def require(isolation: Isolation, required: str) -> None:
    """SandboxError unless ``isolation`` is at least ``required``; as root, never below
    ``namespaces`` (nothing of a task runs as root)."""
    if required not in LEVELS:
        raise SandboxError(f"sandbox isolation {required!r} is not one of {LEVELS}")
    if os.geteuid() == 0 and not isolation.uid_drop:
        raise SandboxError(f"refusing to run tasks: running as root and the sandbox cannot drop "
                           f"privileges ({isolation.uid_reason})")
    if not isolation.at_least(required):
        raise SandboxError(f"sandbox isolation here is {isolation.level!r} but {required!r} is "
                           f"required: {isolation.cgroup_reason if isolation.uid_drop else isolation.uid_reason}. "
                           "Fix the host (docs/sandbox.md) or lower sandbox.isolation knowingly")


def trial_resources() -> tuple[list[str], list[str]]:
    """(trial tmpfs mount points, per-trial cgroup dirs) that exist on this host now: live
    trials of running campaigns, or leftovers of a process that was killed before it closed them."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.startswith("t1ops-trial ")]
    support, _ = cgroups.probe()
    dirs = [] if support is None else sorted(
        str(p) for base in support.bases.values() for p in Path(base).glob("t1ops-*"))
    return mounts, dirs
