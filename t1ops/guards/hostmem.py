"""Host-RAM guard: monitor host and cgroup memory, project a plan, name OOM kills.

Report, section 09: the trainer was killed by the OS, not by CUDA. GPUs sat at
38-44 / 95 GB, but optimizer CPU offload had moved the fp32 Adam state of two
122B models into host RAM which, with 260 concurrent sandbox workers, drove
host free memory to 259 GB of 2265 GB; no "CUDA out of memory" anywhere, the
tell was dmesg. This module:

- :class:`HostMemoryMonitor` samples host (psutil) and cgroup (v1 or v2)
  available memory, warning at ``GuardsConfig.host_ram_warn_fraction``;
- :func:`project_host_memory` / :func:`check_projection` project what a plan
  needs on one host (offloaded Adam of actor + critic, sandboxes x concurrency, and the trainer's
  own copies: the weight sync's full actor on rank 0 and the checkpoint save, docs/weights.md
  "Host memory of sync and checkpoints");
- :class:`OomWatch` explains a death after the fact: SIGKILL exit (-9 / 137)
  plus the cgroup ``oom_kill`` counter and kernel log lines ->
  :class:`HostOOMKilled` "killed by the OS OOM killer" with the numbers.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from t1ops import telemetry
from t1ops.config import GuardsConfig
from t1ops.doctor import Check, check
from t1ops.errors import HostOOMKilled, InputError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "host-oom-kill": ("guards.host_ram_warn_fraction", "guards.adam_host_bytes_per_param", "guards.sandbox_host_gib"),
}

RUNBOOK = "runbooks/host-oom-kill.md"
TRAINER_WEIGHT_BYTES = 4  # the trainer's weights are fp32
# rank 0 at the weight sync's gather: two kept versions, every rank's received piece, the one assembled
SYNC_GATHER_COPIES = 4
GIB = 1024 ** 3
#: cgroup v1 reports "no limit" as a page-rounded 2**63 - 1.
_V1_UNLIMITED = 2 ** 62
SIGKILL_EXITS = (-9, 137)  # Popen's -signal, and a shell's 128 + 9


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "unlimited"
    return f"{n / GIB:.1f} GiB" if abs(n) >= GIB else f"{n / 2 ** 20:.1f} MiB"


def _kv(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


@dataclass(frozen=True)
class CgroupMemory:
    """Memory figures of one cgroup (v1 or v2); None where the kernel does not say."""

    path: Path
    version: int
    limit_bytes: int | None
    usage_bytes: int
    peak_bytes: int | None
    oom_kills: int | None

    @property
    def available_bytes(self) -> int | None:
        return None if self.limit_bytes is None else max(0, self.limit_bytes - self.usage_bytes)


def read_cgroup_memory(d: Path) -> CgroupMemory:
    """Read a cgroup directory: v1 ``memory.*_in_bytes`` + ``memory.oom_control``, or v2 ``memory.*``."""
    d = Path(d)
    if (d / "memory.limit_in_bytes").exists():
        limit = int((d / "memory.limit_in_bytes").read_text())
        peak = d / "memory.max_usage_in_bytes"
        return CgroupMemory(d, 1, None if limit >= _V1_UNLIMITED else limit,
                            int((d / "memory.usage_in_bytes").read_text()),
                            int(peak.read_text()) if peak.exists() else None,
                            _kv((d / "memory.oom_control").read_text()).get("oom_kill"))
    if (d / "memory.current").exists():
        raw = (d / "memory.max").read_text().strip() if (d / "memory.max").exists() else "max"
        peak, events = d / "memory.peak", d / "memory.events"
        return CgroupMemory(d, 2, None if raw == "max" else int(raw), int((d / "memory.current").read_text()),
                            int(peak.read_text()) if peak.exists() else None,
                            _kv(events.read_text()).get("oom_kill") if events.exists() else None)
    raise InputError(f"read_cgroup_memory({d}): neither memory.limit_in_bytes (v1) nor memory.current (v2) "
                     "is there; pass a memory cgroup directory", path=str(d))


def own_cgroup_dir(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> Path | None:
    """This process's memory cgroup directory (v1 memory controller first, then v2), or None."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _id, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = root / "memory" / rel.lstrip("/")
            if (d / "memory.limit_in_bytes").exists():
                return d
    for line in lines:
        _id, controllers, rel = line.split(":", 2)
        if controllers == "":
            for base in (root, root / "unified"):
                d = base / rel.lstrip("/")
                if (d / "memory.current").exists():
                    return d
    return None


@dataclass(frozen=True)
class MemorySnapshot:
    host_total_bytes: int
    host_available_bytes: int
    cgroup: CgroupMemory | None

    @property
    def available_bytes(self) -> int:
        """What is really left: the smaller of host and cgroup headroom."""
        cg = self.cgroup.available_bytes if self.cgroup is not None else None
        return self.host_available_bytes if cg is None else min(cg, self.host_available_bytes)

    def describe(self) -> str:
        s = f"host available {fmt_bytes(self.host_available_bytes)} of {fmt_bytes(self.host_total_bytes)}"
        if self.cgroup is not None:
            c = self.cgroup
            s += (f"; cgroup {c.path} usage {fmt_bytes(c.usage_bytes)} of limit {fmt_bytes(c.limit_bytes)}"
                  + (f", peak {fmt_bytes(c.peak_bytes)}" if c.peak_bytes is not None else ""))
        return s


def snapshot(cgroup_dir: Path | None = None) -> MemorySnapshot:
    vm = psutil.virtual_memory()
    return MemorySnapshot(vm.total, vm.available, read_cgroup_memory(cgroup_dir) if cgroup_dir else None)


class HostMemoryMonitor:
    """Sample host and cgroup memory; event ``host.mem.low`` above the warn fraction of use.

    ``cgroup_dir="auto"`` finds this process's memory cgroup; None watches the host only.
    """

    def __init__(self, warn_fraction: float = 0.9, cgroup_dir: Path | None | str = "auto") -> None:
        self.warn_fraction = warn_fraction
        self.cgroup_dir = own_cgroup_dir() if cgroup_dir == "auto" else cgroup_dir

    def sample(self) -> MemorySnapshot:
        snap = snapshot(self.cgroup_dir)
        telemetry.gauge("host.mem.available_bytes", snap.host_available_bytes)
        used = 1 - snap.host_available_bytes / snap.host_total_bytes
        cg = snap.cgroup
        if cg is not None and cg.limit_bytes:
            telemetry.gauge("host.cgroup.available_bytes", cg.available_bytes)
            used = max(used, cg.usage_bytes / cg.limit_bytes)
        if used >= self.warn_fraction:
            telemetry.event("host.mem.low", "warn", used_fraction=round(used, 3), detail=snap.describe(),
                            runbook=RUNBOOK)
        return snap


@dataclass(frozen=True)
class HostMemoryProjection:
    """Host bytes a plan needs on one host, by term."""

    adam_bytes: float
    sandbox_bytes: float
    baseline_bytes: float
    weight_sync_bytes: float = 0.0  # one rank's two kept versions of its shard + one bucket being sent
    checkpoint_bytes: float = 0.0   # what a save copies (a world of 1: the critic's clone; by shard: nothing)

    @property
    def total_bytes(self) -> float:
        return (self.adam_bytes + self.sandbox_bytes + self.baseline_bytes + self.weight_sync_bytes
                + self.checkpoint_bytes)

    def describe(self) -> str:
        return (f"{fmt_bytes(self.total_bytes)} = offloaded Adam {fmt_bytes(self.adam_bytes)} + sandboxes "
                f"{fmt_bytes(self.sandbox_bytes)} + baseline {fmt_bytes(self.baseline_bytes)} + weight sync "
                f"{fmt_bytes(self.weight_sync_bytes)} + checkpoint save {fmt_bytes(self.checkpoint_bytes)}")


def project_host_memory(actor_params: float, critic_params: float, *, num_hosts: int = 1,
                        offload_optimizer: bool = True, sandbox_concurrency: int = 0,
                        guards: GuardsConfig | None = None, baseline_bytes: float = 0.0,
                        world_size: int = 1, sync_bucket_bytes: float = 0.0) -> HostMemoryProjection:
    """Host RAM one host needs: CPU-offloaded fp32 Adam of actor + critic, sharded over
    ``num_hosts`` (distributed optimizer), plus ``sandbox_concurrency`` sandboxes on this host, plus
    the trainer's copies in one rank's process (``actor_params``: its shard): the weight sync's two kept
    versions of its shard (the behaviour snapshots, the delta's base and the new one) and one bucket
    being sent (``sync_bucket_bytes``: nothing gathers the model, docs/weights.md), and a world of 1's
    critic clone at a save."""
    g = guards or GuardsConfig()
    if actor_params < 0 or critic_params < 0 or num_hosts < 1 or sandbox_concurrency < 0:
        raise InputError(f"project_host_memory(actor_params={actor_params}, critic_params={critic_params}, "
                         f"num_hosts={num_hosts}, sandbox_concurrency={sandbox_concurrency}): counts must be "
                         ">= 0 and num_hosts >= 1", num_hosts=num_hosts)
    adam = (actor_params + critic_params) * g.adam_host_bytes_per_param / num_hosts if offload_optimizer else 0.0
    sync = 2 * actor_params * TRAINER_WEIGHT_BYTES + sync_bucket_bytes
    checkpoint = critic_params * TRAINER_WEIGHT_BYTES if world_size == 1 else 0.0
    return HostMemoryProjection(adam, sandbox_concurrency * g.sandbox_host_gib * GIB, baseline_bytes, sync, checkpoint)


@dataclass(frozen=True)
class ProjectionVerdict:
    fits: bool
    fraction: float
    message: str


def check_projection(projection: HostMemoryProjection, available_bytes: float,
                     warn_fraction: float = 0.9) -> ProjectionVerdict:
    """Warn (event ``host.mem.projection``) when the plan needs more than ``warn_fraction`` of what is free."""
    frac = projection.total_bytes / available_bytes if available_bytes > 0 else float("inf")
    fits = frac < warn_fraction
    msg = (f"host memory projection {projection.describe()} is {frac:.0%} of the {fmt_bytes(available_bytes)} "
           f"available (warn at {warn_fraction:.0%})")
    if not fits:
        msg += ("; the OS OOM killer will take the trainer: shard the offloaded optimizer over more hosts, "
                f"lower sandbox concurrency, or keep the optimizer on GPU. See {RUNBOOK}")
        telemetry.event("host.mem.projection", "warn", fraction=round(frac, 3), message=msg)
    return ProjectionVerdict(fits, frac, msg)


def read_dmesg() -> str | None:
    """The kernel log, or None when it cannot be read (no permission, no dmesg)."""
    try:
        res = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def kernel_oom_lines(pid: int, kernel_log: str | None) -> list[str] | None:
    """Kernel log lines that name ``pid`` as an OOM victim; None if the log was unreadable."""
    if kernel_log is None:
        return None
    # "Memory cgroup out of memory: Killed process 123 (python) ..." / "oom-kill:...,task=python,pid=123,..."
    pat = re.compile(rf"Killed process {pid}\b|oom-kill:.*\bpid={pid}\b")
    return [ln.strip() for ln in kernel_log.splitlines() if pat.search(ln)]


class OomWatch:
    """Explain a process death after the fact. Call :meth:`arm` before the process runs.

    An OOM kill is only ever *shown*, never guessed: the cgroup ``oom_kill``
    counter grew, or the kernel log names the pid. ``returncode`` is the dead
    process's real exit status where it can be read (a child's ``Popen``
    status); pass None where it cannot (a Ray actor is the raylet's child, and
    Ray's own message blames "the OOM killer" for every worker death). A death
    with no such evidence is reported as "killed, cause unknown", naming what
    could and could not be read. ``cgroup_dir="auto"`` watches this process's
    own memory cgroup; None skips the counter.
    """

    def __init__(self, cgroup_dir: Path | None | str = "auto", kernel_log: Callable[[], str | None] = read_dmesg) -> None:
        self.cgroup_dir = own_cgroup_dir() if cgroup_dir == "auto" else cgroup_dir
        self._kernel_log = kernel_log
        self.baseline_oom_kills: int | None = None

    def arm(self) -> "OomWatch":
        self.baseline_oom_kills = read_cgroup_memory(self.cgroup_dir).oom_kills if self.cgroup_dir else None
        return self

    def _evidence(self, pid: int) -> tuple[MemorySnapshot, int | None, int | None, list[str] | None]:
        snap = snapshot(self.cgroup_dir)
        after = snap.cgroup.oom_kills if snap.cgroup is not None else None
        delta = after - self.baseline_oom_kills if after is not None and self.baseline_oom_kills is not None else None
        return snap, after, delta, kernel_oom_lines(pid, self._kernel_log())

    def explain_exit(self, pid: int, returncode: int | None, name: str = "process") -> HostOOMKilled | None:
        """A :class:`HostOOMKilled` when the evidence shows an OOM kill of ``pid``; else None.

        A clean or ordinary exit status (anything but SIGKILL) is never an OOM kill.
        """
        if returncode is not None and returncode not in SIGKILL_EXITS:
            return None
        snap, after, delta, lines = self._evidence(pid)
        if not ((delta or 0) > 0 or lines):
            return None
        facts = [snap.describe()]
        if delta is not None:
            facts.append(f"cgroup oom_kill counter {self.baseline_oom_kills} -> {after}")
        if lines:
            facts.append(f"kernel log: {lines[-1]}")
        status = f"exit {returncode}" if returncode is not None else "exit status not readable"
        msg = (f"{name} (pid {pid}) was killed by the OS OOM killer ({status}): not a crash and not a CUDA OOM. "
               + "; ".join(facts) + ". Reduce host memory: CPU-offloaded Adam of actor and critic, sandbox "
               f"concurrency (t1ops.guards.hostmem.project_host_memory). See {RUNBOOK}.")
        return HostOOMKilled(msg, pid=pid, returncode=returncode, confirmed=True, oom_kill_delta=delta,
                             kernel_lines=lines, available_bytes=snap.available_bytes,
                             cgroup_limit_bytes=snap.cgroup.limit_bytes if snap.cgroup else None,
                             cgroup_peak_bytes=snap.cgroup.peak_bytes if snap.cgroup else None)

    def unexplained(self, pid: int, returncode: int | None, name: str = "process") -> str:
        """The 'killed, cause unknown' verdict, naming which evidence was read and what it said."""
        _, after, delta, lines = self._evidence(pid)
        counter = ("cgroup oom_kill counter unreadable" if delta is None
                   else f"cgroup oom_kill counter unchanged at {after}")
        klog = "kernel log unreadable" if lines is None else f"kernel log names no OOM kill of pid {pid}"
        status = f"exit {returncode}" if returncode is not None else "exit status not readable"
        return f"{name} (pid {pid}) was killed, cause unknown ({status}; {counter}; {klog})"

    def check_exit(self, pid: int, returncode: int | None, name: str = "process") -> None:
        """Raise :class:`HostOOMKilled` (event ``host.oom_killed``) for a shown OOM kill; for any other
        SIGKILL or unreadable status emit ``process.killed`` with the 'cause unknown' verdict."""
        err = self.explain_exit(pid, returncode, name)
        if err is not None:
            telemetry.event("host.oom_killed", "error", pid=pid, returncode=returncode, message=err.message)
            raise err
        if returncode is None or returncode in SIGKILL_EXITS:
            telemetry.event("process.killed", "error", pid=pid, returncode=returncode,
                            message=self.unexplained(pid, returncode, name))


@check
def host_memory_cgroup() -> Check:
    """Host and own-cgroup headroom; whether OOM kills can be counted."""
    d = own_cgroup_dir()
    snap = snapshot(d)
    counter = "oom_kill counter readable" if snap.cgroup is not None and snap.cgroup.oom_kills is not None \
        else "no oom_kill counter: OOM kills are inferred from SIGKILL exits and dmesg"
    return Check("host_memory_cgroup", "ok" if snap.cgroup is not None else "warn",
                 f"{snap.describe()}; effective available {fmt_bytes(snap.available_bytes)}; {counter}")
