"""Host checks a user runs before a campaign (`t1ops doctor`).

Each check returns a :class:`Check` ``{name, status: ok|warn|fail, detail}``.
Checks are registered with :func:`check`; guard modules add their own.
"""
from __future__ import annotations

import resource
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Literal

import psutil

Status = Literal["ok", "warn", "fail"]

#: The report's fd failure happened at the default soft limit of 1024; a
#: campaign with hundreds of concurrent sandboxes wants far more.
MIN_NOFILE = 65_536


@dataclass
class Check:
    name: str
    status: Status
    detail: str
    facts: dict = field(default_factory=dict)   # structured findings (in --json only)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not d["facts"]:
            del d["facts"]
        return d


_CHECKS: list[Callable[[], Check | list[Check]]] = []


def check(fn: Callable[[], Check | list[Check]]) -> Callable[[], Check | list[Check]]:
    """Register a doctor check."""
    _CHECKS.append(fn)
    return fn


def run_checks() -> list[Check]:
    """Run every registered check; a check that raises is reported as ``fail``."""
    import importlib
    import pkgutil

    import t1ops.guards

    for mod in pkgutil.iter_modules(t1ops.guards.__path__):  # guard modules register their checks
        importlib.import_module(f"t1ops.guards.{mod.name}")

    out: list[Check] = []
    for fn in _CHECKS:
        try:
            res = fn()
        except Exception as err:  # a broken check must not hide the others
            res = Check(fn.__name__, "fail", f"check raised {type(err).__name__}: {err}")
        out.extend(res if isinstance(res, list) else [res])
    return out


@check
def nofile_limit() -> Check:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    detail = f"soft={soft} hard={hard}"
    if soft < MIN_NOFILE:
        fix = "t1ops raises soft to hard at start-up" if hard >= MIN_NOFILE else "raise the hard limit (ulimit -Hn / limits.conf)"
        return Check("rlimit_nofile", "warn", f"{detail}; soft < {MIN_NOFILE}: {fix}")
    return Check("rlimit_nofile", "ok", detail)


@check
def host_ram() -> Check:
    vm = psutil.virtual_memory()
    gib = 1024 ** 3
    detail = f"total={vm.total / gib:.1f} GiB available={vm.available / gib:.1f} GiB"
    return Check("host_ram", "warn" if vm.available < 4 * gib else "ok", detail)


@check
def kernel_log() -> Check:
    try:
        res = subprocess.run(["dmesg", "--level=err,warn"], capture_output=True, timeout=5, text=True)
        readable = res.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        readable = False
    return Check("kernel_log", "ok" if readable else "warn",
                 "dmesg readable (OOM-kill lines can be found)" if readable
                 else "dmesg not readable: OOM kills are detected from exit codes and cgroup counters only")


def _cgroup_memory_events() -> Path | None:
    for p in (Path("/sys/fs/cgroup/memory.events"), Path("/sys/fs/cgroup/memory/memory.oom_control")):
        if p.exists():
            return p
    return None


@check
def cgroup_memory_events() -> Check:
    p = _cgroup_memory_events()
    if p is None:
        return Check("cgroup_memory_events", "warn", "no cgroup memory.events/memory.oom_control found")
    try:
        p.read_text()
    except OSError as err:
        return Check("cgroup_memory_events", "warn", f"{p} not readable: {err}")
    return Check("cgroup_memory_events", "ok", f"{p} readable (oom_kill counter available)")


@check
def sandbox_isolation() -> Check:
    """The trial isolation in effect (docs/sandbox.md): uid drop, namespaces, cgroup or the
    rlimit fallback. ``t1ops run`` refuses a level below ``sandbox.isolation``."""
    from rl.agent.sandbox import probe_isolation

    iso = probe_isolation()
    facts = iso.to_dict()
    detail = (f"level={iso.level}; uid drop: {iso.uid_drop} ({iso.uid_reason}); namespaces: "
              f"{','.join(iso.namespaces) or 'none'}; limits: {iso.limits_reason}")
    status: Status = "ok" if iso.level == "strict" else ("warn" if iso.level == "namespaces" else "fail")
    return Check("sandbox_isolation", status, detail, facts)


@check
def sandbox_leftovers() -> Check:
    """Trial tmpfs mounts and cgroups that exist now (a killed campaign cannot close its trials)."""
    from rl.agent.sandbox.isolation import trial_resources

    mounts, cgroups = trial_resources()
    facts = {"mounts": mounts, "cgroups": cgroups}
    if not mounts and not cgroups:
        return Check("sandbox_leftovers", "ok", "no trial tmpfs or cgroup on this host", facts)
    return Check("sandbox_leftovers", "warn",
                 f"{len(mounts)} trial tmpfs mounts and {len(cgroups)} trial cgroups exist: trials of a "
                 "running campaign, or leftovers of a killed one (then: umount -l <mount>; rmdir "
                 "<cgroup>; docs/sandbox.md)", facts)


@check
def container_runtime() -> Check:
    """The container backend's runtime, its version, and what t1ops runs left behind
    (docs/containers.md): containers/networks/volumes labelled t1ops.run, owner alive or not."""
    from rl.agent.container import runtime

    ok, why = runtime.available()
    if not ok:
        return Check("container_runtime", "warn", f"container backend unavailable: {why}",
                     {"available": False})
    left = runtime.leftovers()
    dead = [x for x in left if not x.owner_alive]
    facts = {"available": True, "cli": runtime.cli(), "version": runtime.version(),
             "leftovers": [x.__dict__ for x in left], "dead": len(dead)}
    detail = f"{runtime.cli()} {runtime.version()}; {len(left)} t1ops containers/networks/volumes"
    if dead:
        return Check("container_runtime", "warn", detail + f", {len(dead)} of dead runs "
                     "(t1ops doctor --reap removes them)", facts)
    return Check("container_runtime", "ok", detail + (" (of live runs)" if left else ""), facts)


@check
def ray_importable() -> Check:
    try:
        import ray
    except Exception as err:
        return Check("ray", "fail", f"ray not importable: {err}; pip install 'ray[default]'")
    return Check("ray", "ok", f"ray {ray.__version__}")


@check
def torch_threads() -> Check:
    import torch

    return Check("torch", "ok", f"torch {torch.__version__}, intra-op threads={torch.get_num_threads()}, "
                 f"cuda={'yes' if torch.cuda.is_available() else 'no'}")
