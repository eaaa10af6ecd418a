"""Local sandbox: one directory, one process group, rlimits and no network per trial.

Layout (``<root>/<run_id>/<task>-<trial_idx>-<uuid8>/``)::

    trial.json      who the trial belongs to (run id, task, budget): root-owned
    workspace/      the agent's cwd and HOME, a copy of the task's environment/
    logs/           captured stdout/stderr of each command: out of the agent's reach
    tests/          created by the verifier only, after the agent finishes
    verifier/       created by the verifier only (ctrf.json, run_tag, result.json)

Each command runs ``bash -c CMD`` in a new session (its own process group),
with ``resource.setrlimit`` limits set in the child before exec (CPU seconds,
address space, processes, file size, open files), a private network
namespace where the kernel allows it, and, when we are root, an unprivileged
uid so the agent cannot write outside its workspace. On a wall-clock timeout
the whole process group is killed, and any process still carrying the
trial's marker is swept. A limit ends the command with a named ``reason``;
the caller continues with the next command or trial.
"""
from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import resource
import secrets as secrets_mod
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import psutil

from rl.agent.secrets import collect_secrets, redact
from rl.agent.tasks import Budget, Task, effective_timeout
from rl.errors import InputError, SandboxError, TrialDirError

log = logging.getLogger("rl.agent.sandbox")

AGENT_UID = 1_000_000          # base of the per-trial agent uids (no passwd entry needed)
AGENT_UID_SPAN = 1_000_000_000  # each trial draws its own uid: its own NPROC count, its own sweep
VERIFIER_UID = 65533   # a second unprivileged uid, so the agent's leftovers cannot touch verifier/
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 16384, 1 << 18
MARKER_ENV = "T1_TRIAL_ID"
LIMIT_REASONS = ("cpu_limit", "memory_limit", "process_limit", "file_size_limit", "open_files_limit",
                 "disk_limit")
DISK_POLL_S = 0.25     # how often a running command's workspace size is checked
_MEMORY_PATTERNS = ("MemoryError", "Cannot allocate memory", "bad_alloc", "memory exhausted",
                    "out of memory")
_PROCESS_PATTERNS = ("fork: retry", "fork: Resource temporarily unavailable",
                     "Resource temporarily unavailable", "BlockingIOError")
_NOFILE_PATTERNS = ("Too many open files",)


@dataclass(frozen=True)
class Limits:
    """Per-command resource limits (applied with setrlimit in the child)."""

    cpu_s: int = 30
    memory_mb: int = 1024          # RLIMIT_AS: address space, so it bounds what malloc can get
    num_procs: int = 64            # RLIMIT_NPROC for the sandbox uid (the fork-bomb stop)
    file_size_mb: int = 64         # RLIMIT_FSIZE: a runaway writer gets SIGXFSZ
    num_open_files: int = 256
    max_output_bytes: int = 64_000  # stdout/stderr kept per command (the rest is cut)
    disk_mb: int = 256             # whole workspace; many files each under file_size_mb add up
    num_files: int = 20_000        # workspace entries (an inode bomb of empty files)

    def __post_init__(self) -> None:
        for name in ("cpu_s", "memory_mb", "num_procs", "file_size_mb", "num_open_files",
                     "max_output_bytes", "disk_mb", "num_files"):
            if getattr(self, name) <= 0:
                raise InputError(f"Limits.{name} = {getattr(self, name)} must be > 0", argument=name)


VERIFIER_LIMITS = Limits(cpu_s=120, memory_mb=4096, num_procs=256, file_size_mb=64,
                         num_open_files=1024)


@dataclass(frozen=True)
class ExecResult:
    """What one command did. ``reason``: ok | exit_nonzero | timeout | budget_exhausted |
    cpu_limit | memory_limit | process_limit | file_size_limit | open_files_limit."""

    stdout: str
    stderr: str
    exit_code: int | None
    reason: str
    duration_s: float
    truncated: bool = False

    @property
    def limit_hit(self) -> bool:
        return self.reason in LIMIT_REASONS


@dataclass(frozen=True)
class Isolation:
    """What isolation this host allows, probed once, with the reason for any fallback."""

    network_isolated: bool
    network_reason: str
    agent_uid: int | None          # base of per-trial uids; None: the agent keeps the host uid
    verifier_uid: int | None
    uid_reason: str
    can_hide_paths: bool = False   # a private mount namespace can cover the task pool with tmpfs
    hide_reason: str = "not probed"


# libc is loaded once here, in the parent: a dlopen() inside preexec_fn can deadlock when
# another thread held the loader lock at fork time (seen with concurrent trials).
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.unshare.argtypes = [ctypes.c_int]
_LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_HIDE_FLAGS = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC


def _checked(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, what)


def _libc_unshare_net() -> None:
    _checked(_LIBC.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")


def _libc_hide(paths: tuple[bytes, ...]) -> None:
    """In a new mount namespace, cover each path with an empty read-only tmpfs."""
    _checked(_LIBC.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _checked(_LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    for path in paths:
        _checked(_LIBC.mount(b"t1ops-hidden", path, b"tmpfs", _HIDE_FLAGS, b"size=4k,mode=0555"),
                 "mount tmpfs over a hidden path")


def _make_preexec(limits: Limits, *, netns: bool, uid: int | None,
                  hide: tuple[str, ...] = ()) -> Callable[[], None]:
    """The child's setup between fork and exec. Everything that could allocate a lock (loading
    libc, counting processes, encoding paths) is computed here, in the parent."""
    mb = 1024 * 1024
    nproc = limits.num_procs
    if uid is None:  # same uid as the host: the limit counts the host's own processes too
        nproc += len([p for p in psutil.process_iter(["uids"]) if p.info["uids"]
                      and p.info["uids"].real == os.getuid()])
    rlimits = ((resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 2)),
               (resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb)),
               (resource.RLIMIT_FSIZE, (limits.file_size_mb * mb, limits.file_size_mb * mb)),
               (resource.RLIMIT_NOFILE, (limits.num_open_files, limits.num_open_files)),
               (resource.RLIMIT_CORE, (0, 0)),
               (resource.RLIMIT_NPROC, (nproc, nproc)))
    hide_b = tuple(os.fsencode(p) for p in hide)

    def preexec() -> None:
        if netns:
            _libc_unshare_net()
        if hide_b:
            _libc_hide(hide_b)
        for which, value in rlimits:
            resource.setrlimit(which, value)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
    return preexec


@functools.lru_cache(maxsize=4)
def probe_isolation(*, isolate_network: bool = True, drop_privileges: bool = True) -> Isolation:
    """Find out whether a private network namespace and a uid drop work here (logged if not;
    probed once per process and setting)."""
    net_ok, net_reason = False, "network isolation disabled by the caller"
    if isolate_network:
        try:
            subprocess.run(["/bin/true"], preexec_fn=_libc_unshare_net, check=True, timeout=10)
            net_ok, net_reason = True, "private network namespace (unshare CLONE_NEWNET)"
        except (OSError, subprocess.SubprocessError) as e:
            net_reason = f"unshare(CLONE_NEWNET) failed ({e}); commands keep the host network"
            log.warning("sandbox: %s", net_reason)
    hide_ok, hide_reason = _probe_hide()
    if drop_privileges and os.geteuid() == 0:
        if _uid_can_run_python(VERIFIER_UID):
            return Isolation(net_ok, net_reason, AGENT_UID, VERIFIER_UID,
                             f"agent runs as a per-trial uid >= {AGENT_UID}, verifier as uid "
                             f"{VERIFIER_UID}", hide_ok, hide_reason)
        reason = (f"agent runs as a per-trial uid >= {AGENT_UID}; the verifier stays on the host "
                  f"uid because uid {VERIFIER_UID} cannot execute {sys.executable} (an ancestor "
                  "dir is private)")
        log.warning("sandbox: %s", reason)
        return Isolation(net_ok, net_reason, AGENT_UID, None, reason, hide_ok, hide_reason)
    uid_reason = ("uid drop disabled by the caller" if not drop_privileges else
                  f"not root (euid {os.geteuid()}): agent and verifier share the host uid; "
                  "integrity rests on checksums and tamper scans")
    if drop_privileges:
        log.warning("sandbox: %s", uid_reason)
    return Isolation(net_ok, net_reason, None, None, uid_reason, hide_ok, hide_reason)


def _probe_hide() -> tuple[bool, str]:
    """Whether a child can cover a directory with tmpfs in its own mount namespace."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="t1ops-hide-probe-") as d:
        (Path(d) / "secret").write_text("x")
        try:
            d_b = os.fsencode(d)
            out = subprocess.run(["/bin/ls", "-A", d], preexec_fn=lambda: _libc_hide((d_b,)),
                                 capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError) as e:
            reason = f"cannot hide the task pool from the agent ({e}); it stays readable"
            log.warning("sandbox: %s", reason)
            return False, reason
    if out.stdout.strip():
        return False, "tmpfs mount did not cover the probe dir; the task pool stays readable"
    return True, "task pool covered by an empty tmpfs in a private mount namespace"


def _uid_can_run_python(uid: int) -> bool:
    """Whether ``uid`` can start this interpreter (pytest needs it for the verifier)."""
    def drop() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    try:
        subprocess.run([sys.executable, "-c", "import pytest"], preexec_fn=drop, check=True,
                       timeout=30, capture_output=True, cwd="/")
        return True
    except (OSError, subprocess.SubprocessError):
        return False


def _classify(rc: int | None, stderr: str, timed_out: bool, budget_cut: bool) -> str:
    sig = -rc if rc is not None and rc < 0 else (rc - 128 if rc is not None and 128 < rc < 160 else 0)
    if sig == signal.SIGXFSZ or "File size limit exceeded" in stderr:
        return "file_size_limit"
    if sig == signal.SIGXCPU or "CPU time limit exceeded" in stderr:
        return "cpu_limit"
    if any(p in stderr for p in _PROCESS_PATTERNS):
        return "process_limit"
    if any(p in stderr for p in _MEMORY_PATTERNS):
        return "memory_limit"
    if any(p in stderr for p in _NOFILE_PATTERNS):
        return "open_files_limit"
    if timed_out:
        return "budget_exhausted" if budget_cut else "timeout"
    return "ok" if rc == 0 else "exit_nonzero"


def sweep(marker: str, pgid: int | None = None, *, uid: int | None = None, max_rounds: int = 5) -> int:
    """SIGKILL the process group and every process whose environment carries ``marker`` or
    that runs as the trial's own ``uid`` (catches processes that left the group with setsid
    and cleared their environment), repeating while a fork bomb still spawns. Returns how
    many were found alive."""
    found = 0
    for _ in range(max_rounds):
        alive = [p for p in psutil.process_iter(["pid", "uids"]) if _carries(p, marker)
                 or (uid is not None and p.info["uids"] is not None and p.info["uids"].real == uid)]
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in alive:
            try:
                proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        found += len(alive)
        if not alive:
            break
    return found


def _carries(proc: psutil.Process, marker: str) -> bool:
    try:
        return proc.environ().get(MARKER_ENV) == marker
    except (psutil.Error, OSError):
        return False


def run_limited(argv: list[str], *, cwd: Path, env: Mapping[str, str], limits: Limits,
                timeout_s: float, log_dir: Path, marker: str, isolation: Isolation,
                uid: int | None, budget_cut: bool = False, secrets: Mapping[str, str] = {},
                hide: tuple[str, ...] = (), sweep_uid: bool = False) -> ExecResult:
    """Run ``argv`` under ``limits`` with its own process group; never raises for what the
    command does (limits and timeouts become ``reason``), only for failing to start it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = uuid.uuid4().hex[:8]
    out_path, err_path = log_dir / f"{stamp}.out", log_dir / f"{stamp}.err"
    preexec = _make_preexec(limits, netns=isolation.network_isolated, uid=uid, hide=hide)
    own_uid = uid if sweep_uid else None
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env={**env, MARKER_ENV: marker}, stdout=out,
                                    stderr=err, stdin=subprocess.DEVNULL, preexec_fn=preexec,
                                    start_new_session=True, close_fds=True)
        except (OSError, subprocess.SubprocessError) as e:
            raise SandboxError(f"could not start {argv[0]} in {cwd}: {e}", argv=argv) from e
        rc, timed_out, disk_full = _wait_watching(proc, cwd, limits, timeout_s, t0)
        if timed_out or disk_full:
            sweep(marker, proc.pid, uid=own_uid)
            rc = proc.wait()
    num_left = sweep(marker, proc.pid, uid=own_uid)   # background children outlive a clean exit too
    duration_s = time.monotonic() - t0
    stdout, t_out = _read_capped(out_path, limits.max_output_bytes)
    stderr, t_err = _read_capped(err_path, limits.max_output_bytes)
    reason = "disk_limit" if disk_full else _classify(rc, stderr, timed_out, budget_cut)
    if reason in ("ok", "exit_nonzero") and num_left >= limits.num_procs // 2:
        reason = "process_limit"   # a swarm of leftovers near the cap: a fork bomb, cut short
    if reason != "ok" and reason != "exit_nonzero":
        log.warning("sandbox %s: command ended by %s after %.2fs (exit %s)", marker, reason,
                    duration_s, rc)
    return ExecResult(redact(stdout, secrets), redact(stderr, secrets),
                      None if timed_out or disk_full else rc,
                      reason, duration_s, t_out or t_err)


def _wait_watching(proc: subprocess.Popen, cwd: Path, limits: Limits, timeout_s: float,
                   t0: float) -> tuple[int | None, bool, bool]:
    """Wait for ``proc`` up to ``timeout_s``, checking the workspace's size every DISK_POLL_S.
    Returns (exit code or None, timed out, disk limit hit)."""
    deadline = t0 + max(timeout_s, 0.01)
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(DISK_POLL_S, deadline - time.monotonic()))), False, False
        except subprocess.TimeoutExpired:
            pass
        if _tree_over(cwd, limits.disk_mb * 1024 * 1024, limits.num_files):
            return None, False, True
        if time.monotonic() >= deadline:
            return None, True, False


def _tree_over(root: Path, max_bytes: int, max_entries: int) -> bool:
    """Whether the tree under ``root`` holds more than ``max_bytes`` or ``max_entries``
    (stops walking as soon as either is passed; links are not followed)."""
    total, entries, stack = 0, 0, [str(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    entries += 1
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                    if total > max_bytes or entries > max_entries:
                        return True
        except OSError:
            continue
    return False


def _read_capped(path: Path, max_bytes: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    return data[:max_bytes].decode("utf-8", errors="replace"), len(data) > max_bytes


@dataclass
class Trial:
    """One attempt at one task. The agent loop calls :meth:`exec`; the verifier takes over after."""

    task: Task
    run_id: str
    trial_idx: int
    trial_id: str
    dir: Path
    budget: Budget
    limits: Limits
    isolation: Isolation
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    uid: int | None = None                 # this trial's own agent uid (None: host uid)
    hidden_paths: tuple[str, ...] = ()     # covered by tmpfs for the agent (the task pool)
    started_monotonic: float = field(default_factory=time.monotonic)
    finished: bool = False
    verified: bool = False      # set by the verifier: a trial is verified exactly once
    num_commands: int = 0

    @property
    def workspace(self) -> Path:
        return self.dir / "workspace"

    @property
    def remaining_s(self) -> float:
        return self.budget.timeout_s - (time.monotonic() - self.started_monotonic)

    def agent_env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.workspace),
                "LANG": "C.UTF-8", "TMPDIR": str(self.workspace), **self.secrets}

    def exec(self, cmd: str, timeout_s: float | None = None) -> ExecResult:
        """Run one shell command in the workspace, bounded by ``timeout_s`` and by what is
        left of the trial's agent budget; output comes back with secrets redacted."""
        if self.finished:
            raise SandboxError(f"trial {self.trial_id} is finished; the verifier owns it now",
                               trial_id=self.trial_id)
        remaining = self.remaining_s
        if remaining <= 0:
            return ExecResult("", f"agent budget of {self.budget.timeout_s:g}s is spent", None,
                              "budget_exhausted", 0.0)
        bound = remaining if timeout_s is None else min(timeout_s, remaining)
        self.num_commands += 1
        return run_limited(["/bin/bash", "-c", cmd], cwd=self.workspace, env=self.agent_env(),
                           limits=self.limits, timeout_s=bound, log_dir=self.dir / "logs",
                           marker=self.trial_id, isolation=self.isolation, uid=self.uid,
                           budget_cut=timeout_s is None or remaining < timeout_s, secrets=self.secrets,
                           hide=self.hidden_paths, sweep_uid=True)

    def finish(self) -> int:
        """End the agent's part: kill anything it left running; returns how many were killed."""
        self.finished = True
        return sweep(self.trial_id, uid=self.uid)


class Sandbox:
    """Creates trials under ``<root>/<run_id>/``; one per campaign (or per rollout worker)."""

    def __init__(self, root: str | Path, run_id: str, *, limits: Limits = Limits(),
                 isolate_network: bool = True, drop_privileges: bool = True,
                 agent_timeout_override_s: float | None = None, allow_lower_timeout: bool = False,
                 environ: Mapping[str, str] | None = None, hide_task_pool: bool = True) -> None:
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise InputError(f"run_id {run_id!r} must be a non-empty name without '/'", argument="run_id")
        self.root, self.run_id, self.limits = Path(root), run_id, limits
        self.run_dir = self.root / run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.run_dir, 0o711)   # traversable, not listable: siblings stay unguessable
        self.override_s, self.allow_lower = agent_timeout_override_s, allow_lower_timeout
        self.environ = os.environ if environ is None else environ
        self.hide_task_pool = hide_task_pool
        self.isolation = probe_isolation(isolate_network=isolate_network,
                                         drop_privileges=drop_privileges)

    def create(self, task: Task, trial_idx: int) -> Trial:
        """A fresh, run-tagged trial directory with the task's environment/ in its workspace."""
        budget = effective_timeout(task.agent_timeout_s, self.override_s,
                                   allow_lower=self.allow_lower, what=f"agent[{task.name}]")
        secrets = collect_secrets(task.required_env_keys, self.environ)
        trial_id = f"{task.name}-{trial_idx}-{uuid.uuid4().hex[:8]}"
        tdir = self.run_dir / trial_id
        try:
            tdir.mkdir()
        except FileExistsError as e:
            raise TrialDirError(f"trial dir {tdir} already exists; trial dirs are never reused",
                                path=str(tdir)) from e
        os.chmod(tdir, 0o755)
        ws = tdir / "workspace"
        if task.environment_dir.is_dir():
            shutil.copytree(task.environment_dir, ws, symlinks=True)
        else:
            ws.mkdir()
        (tdir / "logs").mkdir(mode=0o700)
        (tdir / "trial.json").write_text(json.dumps({
            "run_id": self.run_id, "trial_id": trial_id, "task": task.name, "trial_idx": trial_idx,
            "agent_budget_s": budget.timeout_s, "budget_source": budget.source,
            "budget_reason": budget.reason, "tests_digest": task.tests_digest}, indent=1))
        uid = None
        if self.isolation.agent_uid is not None:
            uid = self.isolation.agent_uid + secrets_mod.randbelow(AGENT_UID_SPAN)
            for p in [ws, *ws.rglob("*")]:
                os.lchown(p, uid, uid)
        return Trial(task=task, run_id=self.run_id, trial_idx=trial_idx, trial_id=trial_id,
                     dir=tdir, budget=budget, limits=self.limits, isolation=self.isolation,
                     secrets=secrets, uid=uid, hidden_paths=self._hidden_for(task, tdir))

    def _hidden_for(self, task: Task, tdir: Path) -> tuple[str, ...]:
        """The task pool dir (tests and solutions of every task), unless the trial lives inside it."""
        if not self.hide_task_pool or not self.isolation.can_hide_paths:
            return ()
        pool = task.path.parent.resolve()
        if tdir.resolve().is_relative_to(pool) or pool == Path("/"):
            log.warning("sandbox: trial dir %s is inside the task pool %s; pool left visible", tdir, pool)
            return ()
        return (str(pool),)
