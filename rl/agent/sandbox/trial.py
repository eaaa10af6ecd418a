"""Trials: one directory, one tmpfs, one cgroup and two uids per attempt at a task.

Layout (``<root>/<run_id>/<task>-<trial_idx>-<uuid8>/``, root-owned)::

    trial.json      who the trial belongs to (run id, task, budget, uids, limits)
    logs/           redacted stdout/stderr of each command (root only)
    fs/             the trial's tmpfs (size=storage_mb, nr_inodes=num_files):
      workspace/      -> /app (or the task's WORKDIR): the agent's cwd, a copy of environment/
      tmp/ var_tmp/ shm/ logs_agent/   -> /tmp /var/tmp /dev/shm /logs/agent for the agent
      vtmp/           -> /tmp /var/tmp /dev/shm for the verifier (fresh, empty)
    .root/          mount point of each command's private root (see jail_init.py)
    solution/       oracle trials only -> /solution (read-only)
    tests/          created by the verifier only -> /tests (read-only)
    verifier/       created by the verifier only -> /logs/verifier

Every command, the agent's and the verifier's, runs in its own fresh namespace set built by
``jail.run_jailed``; nothing else of the host is visible, so other trials, the task pool, the
project tree and ``.git`` do not exist for it. See docs/sandbox.md.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import secrets as secrets_mod
import shutil
import time
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from rl.agent.bounded import read_regular, short
from rl.agent.environment import LocalEnvironment
from rl.agent.sandbox.cgroup import TrialCgroup
from rl.agent.sandbox.cgroup import probe as probe_cgroup
from rl.agent.sandbox.isolation import AGENT_UID, UID_SPAN, VERIFIER_UID, Isolation
from rl.agent.sandbox.jail import View, run_jailed
from rl.agent.sandbox.limits import ExecResult, Limits
from rl.agent.secrets import redact
from rl.agent.task_toml import workdir_problem
from rl.agent.tasks import Budget, Task
from rl.errors import SandboxError

log = logging.getLogger("rl.agent.sandbox")

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
AGENT_DIRS = ("workspace", "tmp", "var_tmp", "shm", "logs_agent")
_LIBC = ctypes.CDLL(None, use_errno=True)


def mount_trial_fs(path: Path, limits: Limits) -> None:
    """The trial's own tmpfs: its size and inode count are the storage limit, no poll."""
    path.mkdir(mode=0o755)
    opts = f"size={limits.storage_mb}m,nr_inodes={limits.num_files},mode=0755".encode()
    if _LIBC.mount(b"t1ops-trial", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"cannot mount the trial tmpfs at {path}: {os.strerror(err)}", path=str(path))


def unmount(path: Path) -> None:
    if os.path.ismount(path):
        _LIBC.umount2(os.fsencode(path), MNT_DETACH)


def collect_files(src: Path, dst: Path, max_bytes: int = 16 * 2**20, *,
                  secrets: Mapping[str, str] = {}, max_depth: int = 16,
                  max_entries: int = 10_000, max_name: int = 255) -> list[str]:
    """Copy the regular files under ``src`` into ``dst`` (same relative paths, root-owned),
    redacted (``secrets``), never following a link or opening anything but a regular file
    (``O_NOFOLLOW | O_NONBLOCK``, fstat), stopping at ``max_bytes`` in all; existing names
    in ``dst`` win. Deeper than ``max_depth``, more than ``max_entries`` or a name longer
    than ``max_name`` bytes is skipped, and named in the returned notes."""
    left, stack, seen, notes = max_bytes, [""], 0, []
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(src / rel))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            sub = os.path.join(rel, entry.name)
            if seen > max_entries or len(os.fsencode(entry.name)) > max_name or sub.count("/") >= max_depth:
                notes.append(f"skipped {short(sub, 120)} (more than {max_entries} entries, a name over "
                             f"{max_name} bytes or deeper than {max_depth})")
                if seen > max_entries:
                    return notes
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    (dst / sub).mkdir(exist_ok=True)
                    stack.append(sub)
                elif entry.is_file(follow_symlinks=False) and not (dst / sub).exists():
                    data, _ = read_regular(entry.path, max(left, 0))
                    left -= len(data)
                    (dst / sub).write_bytes(redact_bytes(data, secrets))
            except OSError as e:   # a file over the budget, a FIFO swapped in: skipped, named
                notes.append(f"skipped {short(sub, 120)} ({short(e, 120)})")
            if left <= 0:
                return notes
    return notes


def redact_bytes(data: bytes, secrets: Mapping[str, str]) -> bytes:
    """``data`` with every secret (and its encoded forms) replaced, bytes kept otherwise."""
    if not secrets:
        return data
    return redact(data.decode("utf-8", errors="surrogateescape"), secrets).encode(
        "utf-8", errors="surrogateescape")


def chown_tree(root: Path, uid: int, *, owner_rw: bool = False) -> None:
    """lchown every entry under ``root`` (iterative, links are never followed); ``owner_rw``
    also gives the new owner read/write (and search on dirs), as a verifier running as root
    in a container would have."""
    def own(path: str, is_dir: bool, is_link: bool) -> None:
        os.lchown(path, uid, uid)
        if owner_rw and not is_link:
            os.chmod(path, os.lstat(path).st_mode & 0o7777 | (0o700 if is_dir else 0o600))

    own(str(root), True, False)
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                is_dir = entry.is_dir(follow_symlinks=False)
                own(entry.path, is_dir, entry.is_symlink())
                if is_dir:
                    stack.append(entry.path)


@dataclass(eq=False)
class Trial:
    """One attempt at one task. The agent loop calls :meth:`exec`; the verifier takes over after
    (:meth:`run_verifier`); :meth:`close` unmounts its tmpfs and removes its cgroup."""

    task: Task
    run_id: str
    trial_idx: int
    trial_id: str
    dir: Path
    budget: Budget
    limits: Limits
    isolation: Isolation
    uid: int
    verifier_uid: int
    network: bool = False
    workdir: str = "/app"
    oracle: bool = False
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    env: dict[str, str] = field(default_factory=dict)      # declared task env for the agent
    cgroup: TrialCgroup | None = field(default=None, repr=False)
    started_monotonic: float = field(default_factory=time.monotonic)
    finished: bool = False
    verified: bool = False      # set by the verifier: a trial is verified exactly once
    closed: bool = False
    num_commands: int = 0
    _release: weakref.finalize | None = field(default=None, repr=False)

    @property
    def fs(self) -> Path:
        return self.dir / "fs"

    @property
    def workspace(self) -> Path:
        return self.fs / "workspace"

    @property
    def remaining_s(self) -> float:
        return self.budget.timeout_s - (time.monotonic() - self.started_monotonic)

    def agent_env(self) -> dict[str, str]:
        """Only declared variables: a fixed base, the task's env and its declared secrets."""
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.workdir, "LANG": "C.UTF-8",
                "TMPDIR": "/tmp", **self.env, **self.secrets}

    def _agent_view(self) -> View:
        rw = ((self.workdir, self.workspace), ("/tmp", self.fs / "tmp"),
              ("/var/tmp", self.fs / "var_tmp"), ("/dev/shm", self.fs / "shm"),
              ("/logs/agent", self.fs / "logs_agent"))
        ro = (("/solution", self.dir / "solution"),) if self.oracle else ()
        return View(self.dir / ".root", rw=rw, ro=ro, cwd=self.workdir)

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
        return self._run_command(cmd, bound, budget_cut=timeout_s is None or remaining < timeout_s)

    def _run_command(self, cmd: str, timeout_s: float, *, budget_cut: bool) -> ExecResult:
        """Run ``cmd`` as the agent for at most ``timeout_s`` (the backend's part of exec)."""
        return run_jailed(["/bin/bash", "-c", cmd], self._agent_view(), env=self.agent_env(),
                          uid=self.uid, limits=self.limits, cgroup=self.cgroup, timeout_s=timeout_s,
                          log_dir=self.dir / "logs", network=self.network, secrets=self.secrets,
                          budget_cut=budget_cut)

    def finish(self) -> int:
        """End the agent's part: kill anything it left running; returns how many were killed."""
        self.finished = True
        return self.cgroup.kill_all() if self.cgroup is not None else 0

    def run_verifier(self, argv: list[str], *, env: Mapping[str, str], limits: Limits,
                     timeout_s: float, tests: Path, vdir: Path,
                     files: tuple[tuple[str, str], ...] = ()) -> ExecResult:
        """Run the verifier in a fresh namespace set as this trial's verifier uid: the workspace
        (now owned by that uid) at the workdir, ``/tests`` read-only, an empty ``/logs/verifier``
        and ``/tmp`` on the trial's tmpfs, the agent's ``/logs/agent`` read-only; its own cgroup
        with ``limits``. Afterwards the regular files it left in ``/logs/verifier`` (at most
        ``COLLECT_BYTES``, links skipped) are copied into ``vdir`` on disk, root-owned."""
        self.finish()
        out_dir = self.fs / "logs_verifier"
        out_dir.mkdir(mode=0o755)
        for name in ("workspace", "vtmp", "logs_verifier"):
            chown_tree(self.fs / name, self.verifier_uid, owner_rw=True)
        rw = ((self.workdir, self.workspace), ("/logs/verifier", out_dir), ("/tmp", self.fs / "vtmp"),
              ("/var/tmp", self.fs / "vtmp"), ("/dev/shm", self.fs / "vtmp"))
        view = View(self.dir / ".root", rw=rw, ro=(("/tests", tests), ("/logs/agent", self.fs / "logs_agent")),
                    files=files, cwd=self.workdir)
        cg = _make_cgroup(self.isolation, f"{self.trial_id}-verifier", limits)
        try:
            return run_jailed(argv, view, env=env, uid=self.verifier_uid, limits=limits, cgroup=cg,
                              timeout_s=timeout_s, log_dir=self.dir / "logs", network=False,
                              secrets=self.secrets)
        finally:
            if cg is not None:
                cg.remove()
            for note in collect_files(out_dir, vdir, secrets=self.secrets):
                log.warning("trial %s verifier output: %s", self.trial_id, note)

    def close(self) -> None:
        """Kill what is left, unmount the trial's tmpfs (its files go) and drop its cgroup."""
        if self.closed:
            return
        self.finish()
        self.closed = True
        if self._release is not None:
            self._release()


def release(fs: Path, cgroup: TrialCgroup | None) -> None:
    """Unmount a trial's tmpfs and remove its cgroup (also run if a Trial is dropped unclosed,
    and at interpreter exit)."""
    if cgroup is not None:
        cgroup.kill_all()
    unmount(fs)
    if cgroup is not None:
        cgroup.remove()


def _make_cgroup(isolation: Isolation, name: str, limits: Limits) -> TrialCgroup | None:
    if not isolation.cgroup:
        return None
    support, _ = probe_cgroup()
    try:
        return TrialCgroup(support, name, memory_mb=limits.memory_mb, max_pids=limits.num_procs,
                           cpus=limits.cpus)
    except OSError as e:   # TrialCgroup removed what it had made
        raise SandboxError(f"cannot create cgroup t1ops-{short(name, 80)} with memory_mb="
                           f"{limits.memory_mb}, cpus={limits.cpus}: {e.strerror}") from None


def open_trial_dir(tdir: Path, limits: Limits) -> tuple[int, int]:
    """Draw the trial's agent and verifier uids, make its root-only dirs and mount its disk
    (``tdir/fs``, sized by ``limits``): the first part of a trial on both backends."""
    uid = AGENT_UID + secrets_mod.randbelow(UID_SPAN)
    vuid = VERIFIER_UID + secrets_mod.randbelow(UID_SPAN)
    for d in ("logs", ".root"):
        (tdir / d).mkdir(mode=0o700)
    mount_trial_fs(tdir / "fs", limits)
    return uid, vuid


def lay_out_agent_dirs(task: Task, tdir: Path, uid: int, oracle: bool) -> None:
    """The directories of ``tdir/fs`` the agent may write, owned by its ``uid`` (the shared
    temporaries sticky), and the solution for an oracle run: the same layout on both backends."""
    for d in AGENT_DIRS + ("vtmp",):
        (tdir / "fs" / d).mkdir(mode=0o755, exist_ok=True)
    for d in AGENT_DIRS:
        chown_tree(tdir / "fs" / d, uid)
    for d in ("tmp", "var_tmp", "shm", "vtmp"):
        os.chmod(tdir / "fs" / d, 0o1777)
    if oracle:
        _install_solution(task, tdir / "solution")


def create_trial(*, task: Task, run_id: str, trial_idx: int, tdir: Path, budget: Budget,
                 limits: Limits, isolation: Isolation, secrets: dict[str, str], network: bool,
                 workdir: str, oracle: bool, env: Mapping[str, str]) -> Trial:
    """Lay out ``tdir`` (already created, empty) and return its Trial."""
    if workdir_problem(workdir):
        raise SandboxError(f"WORKDIR {workdir_problem(workdir)}", workdir=workdir[:200])
    uid, vuid = open_trial_dir(tdir, limits)
    trial_id = tdir.name
    try:
        LocalEnvironment().populate(task, tdir / "fs" / "workspace")   # environment/ or its Dockerfile
        lay_out_agent_dirs(task, tdir, uid, oracle)
        cg = _make_cgroup(isolation, trial_id, limits)
    except BaseException:   # nothing left behind: no mount, no trial dir, no cgroup
        unmount(tdir / "fs")
        shutil.rmtree(tdir, ignore_errors=True)
        raise
    (tdir / "trial.json").write_text(json.dumps({
        "run_id": run_id, "trial_id": trial_id, "task": task.name, "trial_idx": trial_idx,
        "agent_budget_s": budget.timeout_s, "budget_source": budget.source,
        "budget_reason": budget.reason, "tests_digest": task.tests_digest, "uid": uid,
        "verifier_uid": vuid, "network": network, "workdir": workdir, "oracle": oracle,
        "isolation": isolation.level, "limits": limits.__dict__}, indent=1))
    trial = Trial(task=task, run_id=run_id, trial_idx=trial_idx, trial_id=trial_id, dir=tdir,
                  budget=budget, limits=limits, isolation=isolation, uid=uid, verifier_uid=vuid,
                  network=network, workdir=workdir, oracle=oracle, secrets=secrets, env=dict(env),
                  cgroup=cg)
    trial._release = weakref.finalize(trial, release, trial.fs, cg)
    return trial


def _install_solution(task: Task, dst: Path) -> None:
    src = task.path / "solution"
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    elif task.solution is not None:
        dst.mkdir()
        (dst / "solve.sh").write_text(task.solution)
    else:
        raise SandboxError(f"task {task.name} has no solution/ for an oracle run", task=task.name)
    for p in [dst, *dst.rglob("*")]:
        if not p.is_symlink():
            os.chmod(p, 0o555 if p.is_dir() or p.suffix == ".sh" else 0o444)


def task_limits(base: Limits, task: Task) -> Limits:
    """``base`` with the task's declared resources (``[environment]`` memory_mb, cpus,
    storage_mb) applied."""
    changes = {k: getattr(task, k) for k in ("memory_mb", "cpus", "storage_mb")
               if getattr(task, k, None) is not None}
    return replace(base, **changes) if changes else base


def release_under(root: Path) -> int:
    """Unmount every trial tmpfs under ``root`` and remove those trials' cgroups: for a run whose
    workers are all gone (a SIGKILLed worker cannot close its trials). Returns the mounts freed."""
    from rl.agent.sandbox.cgroup import _mounts

    prefix = str(Path(root).resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.startswith("t1ops-trial ") and line.split()[1].startswith(prefix)]
    for m in mounts:
        _LIBC.umount2(os.fsencode(m), MNT_DETACH)
    names = {Path(m).parent.name for m in mounts}
    for base in set(_mounts().values()):
        for name in names:
            for d in (*Path(base).glob(f"t1ops-{name}*"), *Path(base).glob(f"*/*/t1ops-{name}*")):
                try:
                    d.rmdir()
                except OSError:
                    pass
    return len(mounts)
