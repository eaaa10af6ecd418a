"""What a sandboxed command may use, and how it ended (a limit names itself in ``reason``)."""
from __future__ import annotations

import resource
import signal
from dataclasses import dataclass

from rl.errors import InputError

LIMIT_REASONS = ("cpu_limit", "memory_limit", "process_limit", "file_size_limit", "open_files_limit",
                 "disk_limit")
_MEMORY_PATTERNS = ("MemoryError", "Cannot allocate memory", "bad_alloc", "memory exhausted",
                    "out of memory")
_PROCESS_PATTERNS = ("fork: retry", "fork: Resource temporarily unavailable",
                     "Resource temporarily unavailable", "BlockingIOError")
_NOFILE_PATTERNS = ("Too many open files",)
_DISK_PATTERNS = ("No space left on device",)


@dataclass(frozen=True)
class Limits:
    """Resource limits of one trial. Field names follow Harbor's ``[environment]`` table
    (``memory_mb``, ``cpus``, ``storage_mb``) so a task's declared resources map onto them.

    With a per-trial cgroup (``rl.agent.sandbox.cgroup``) ``memory_mb`` bounds the sum of all
    the trial's processes and its tmpfs pages, ``num_procs`` its process count and ``cpus``
    its CPU share; without one they fall back to per-process rlimits (``RLIMIT_AS``,
    ``RLIMIT_NPROC``). ``storage_mb``/``num_files`` size the trial's own tmpfs."""

    cpu_s: int = 30                # RLIMIT_CPU per process: a spinning command gets SIGXCPU
    memory_mb: int = 1024          # cgroup memory limit (rlimit fallback: RLIMIT_AS per process)
    num_procs: int = 64            # cgroup pids.max and RLIMIT_NPROC of the trial uid
    file_size_mb: int = 64         # RLIMIT_FSIZE: a runaway writer gets SIGXFSZ
    num_open_files: int = 256
    max_output_bytes: int = 64_000  # stdout/stderr kept per command (the rest is cut)
    storage_mb: int = 256          # size= of the trial's tmpfs (workspace, /tmp, /var/tmp, /dev/shm)
    num_files: int = 20_000        # nr_inodes= of that tmpfs (an inode bomb of empty files)
    cpus: float | None = None      # cgroup cpu quota in cores; None: no quota

    def __post_init__(self) -> None:
        for name in ("cpu_s", "memory_mb", "num_procs", "file_size_mb", "num_open_files",
                     "max_output_bytes", "storage_mb", "num_files"):
            if getattr(self, name) <= 0:
                raise InputError(f"Limits.{name} = {getattr(self, name)} must be > 0", argument=name)
        if self.cpus is not None and self.cpus <= 0:
            raise InputError(f"Limits.cpus = {self.cpus} must be > 0 (or None for no quota)",
                             argument="cpus")

    def rlimits(self, *, per_process_memory: bool) -> list[tuple[int, int, int]]:
        """(resource, soft, hard) applied in the jail; RLIMIT_AS only without a cgroup."""
        mb = 1024 * 1024
        out = [(resource.RLIMIT_CPU, self.cpu_s, self.cpu_s + 2),
               (resource.RLIMIT_FSIZE, self.file_size_mb * mb, self.file_size_mb * mb),
               (resource.RLIMIT_NOFILE, self.num_open_files, self.num_open_files),
               (resource.RLIMIT_CORE, 0, 0),
               (resource.RLIMIT_NPROC, self.num_procs, self.num_procs)]
        if per_process_memory:
            out.append((resource.RLIMIT_AS, self.memory_mb * mb, self.memory_mb * mb))
        return out


VERIFIER_LIMITS = Limits(cpu_s=120, memory_mb=4096, num_procs=256, file_size_mb=64,
                         num_open_files=1024)


@dataclass(frozen=True)
class ExecResult:
    """What one command did. ``reason``: ok | exit_nonzero | timeout | budget_exhausted |
    cpu_limit | memory_limit | process_limit | file_size_limit | open_files_limit | disk_limit."""

    stdout: str
    stderr: str
    exit_code: int | None
    reason: str
    duration_s: float
    truncated: bool = False

    @property
    def limit_hit(self) -> bool:
        return self.reason in LIMIT_REASONS


def classify(rc: int | None, stderr: str, timed_out: bool, budget_cut: bool,
             counters: dict[str, int] | None = None) -> str:
    """The reason a command ended: cgroup counters first (they cannot be faked by output),
    then signals, then the messages tools print when a limit refuses them."""
    counters = counters or {}
    if counters.get("oom_kill", 0) > 0:
        return "memory_limit"
    sig = -rc if rc is not None and rc < 0 else (rc - 128 if rc is not None and 128 < rc < 160 else 0)
    if sig == signal.SIGXFSZ or "File size limit exceeded" in stderr or "File too large" in stderr:
        return "file_size_limit"
    if sig == signal.SIGXCPU or "CPU time limit exceeded" in stderr:
        return "cpu_limit"
    if counters.get("pids_max", 0) > 0 or any(p in stderr for p in _PROCESS_PATTERNS):
        return "process_limit"
    if any(p in stderr for p in _MEMORY_PATTERNS):
        return "memory_limit"
    if any(p in stderr for p in _NOFILE_PATTERNS):
        return "open_files_limit"
    if any(p in stderr for p in _DISK_PATTERNS):
        return "disk_limit"
    if timed_out:
        return "budget_exhausted" if budget_cut else "timeout"
    return "ok" if rc == 0 else "exit_nonzero"
