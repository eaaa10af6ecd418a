"""Per-trial cgroups (v1 memory + pids + cpu): limits that sum over every process of a trial.

``RLIMIT_AS`` bounds one process; four processes under it hold four times the limit. A
cgroup bounds their sum, and counts the tmpfs pages they write (the trial's storage) too.
Each trial (and each verification) gets ``t1ops-<name>`` under this process's own cgroup of
each controller; the command's launcher joins it before it execs, so every descendant is
inside. A kill at a limit is read back from the cgroup's own counters (``oom_kill`` in
``memory.oom_control``, ``max`` in ``pids.events``) and recorded with that reason.

cgroup v2 hosts and hosts without writable cgroup mounts get ``None`` from :func:`probe`
with the reason; the sandbox then falls back to per-process rlimits and ``t1ops doctor``
names the fallback.
"""
from __future__ import annotations

import functools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupSupport:
    bases: dict[str, str]      # controller -> this process's own cgroup dir of that controller
    detail: str


def _mounts() -> dict[str, str]:
    """controller -> mount point of its cgroup v1 hierarchy."""
    found: dict[str, str] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup":
            for opt in parts[3].split(","):
                if opt in CONTROLLERS:
                    found[opt] = parts[1]
    return found


def _own_paths() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(","):
            out[c] = path
    return out


@functools.lru_cache(maxsize=1)
def probe() -> tuple[CgroupSupport | None, str]:
    """Whether per-trial v1 cgroups with memory, pids and cpu limits can be made here."""
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as e:
        return None, f"cannot read /proc/self/mounts or /proc/self/cgroup ({e})"
    missing = [c for c in CONTROLLERS if c not in mounts or c not in own]
    if missing:
        return None, (f"no cgroup v1 hierarchy for {missing} (cgroup v2 delegation is not "
                      "supported yet); per-process rlimits only")
    bases = {c: os.path.join(mounts[c], own[c].lstrip("/")) for c in CONTROLLERS}
    sup = CgroupSupport(bases, "cgroup v1 " + ", ".join(f"{c}={bases[c]}" for c in CONTROLLERS))
    try:
        cg = TrialCgroup(sup, f"probe-{os.getpid()}", memory_mb=64, max_pids=8, cpus=1.0)
        cg.remove()
    except OSError as e:
        return None, f"cannot create a child cgroup under {bases} ({e}); per-process rlimits only"
    return sup, sup.detail


class TrialCgroup:
    """One trial's cgroups: created with limits, joined by each command, read, killed, removed."""

    def __init__(self, support: CgroupSupport, name: str, *, memory_mb: int, max_pids: int,
                 cpus: float | None) -> None:
        self.dirs = {c: Path(support.bases[c]) / f"t1ops-{name}" for c in CONTROLLERS}
        try:
            self._create(memory_mb, max_pids, cpus)
        except BaseException:   # a value the kernel refuses: leave no cgroup behind
            self.remove()
            raise

    def _create(self, memory_mb: int, max_pids: int, cpus: float | None) -> None:
        for d in self.dirs.values():
            d.mkdir()
        limit = str(memory_mb * 2**20)
        self._write("memory", "memory.limit_in_bytes", limit)
        if (self.dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
            self._write("memory", "memory.memsw.limit_in_bytes", limit)   # no escape into swap
        self._write("pids", "pids.max", str(max_pids))
        if cpus is not None:
            self._write("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US))
            self._write("cpu", "cpu.cfs_quota_us", str(max(1000, int(cpus * CPU_PERIOD_US))))
        self.procs_files = tuple(os.fsencode(d / "cgroup.procs") for d in self.dirs.values())

    def _write(self, ctrl: str, name: str, value: str) -> None:
        (self.dirs[ctrl] / name).write_text(value)

    def join_current(self) -> None:
        """Move the calling process in (safe between fork and exec: no allocation-heavy work)."""
        for path in self.procs_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def counters(self) -> dict[str, int]:
        """``oom_kill`` and ``pids_max`` events so far (compare before/after one command)."""
        out = {"oom_kill": 0, "pids_max": 0}
        try:
            for line in (self.dirs["memory"] / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    out["oom_kill"] = int(line.split()[1])
            for line in (self.dirs["pids"] / "pids.events").read_text().splitlines():
                if line.startswith("max "):
                    out["pids_max"] = int(line.split()[1])
        except OSError:
            pass
        return out

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.dirs["pids"] / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill_all(self, rounds: int = 50) -> int:
        """SIGKILL every process still in the cgroup (a fork bomb races: repeat until empty)."""
        found = 0
        for _ in range(rounds):
            pids = self.pids()
            if not pids:
                break
            found += len(pids)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        return found

    def remove(self) -> None:
        """Kill what is left and delete the cgroups (their charges move to the parent)."""
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:   # the last exiting task is still being torn down
                    time.sleep(0.02)
