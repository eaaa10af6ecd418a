"""A trial in a container: the same directory, tmpfs, uids, verifier and rules as a local trial.

The trial's tmpfs (``fs/``, size = ``storage_mb``) holds the workspace, ``/tmp``, ``/var/tmp``,
``/dev/shm`` and ``/logs/agent``; they are bound into a container of the task's image whose
root is read-only, so nothing the agent writes lives anywhere else. PID 1 is ``sleep`` as root
with every capability dropped; each agent command is ``podman exec --user <agent uid>``
(``no-new-privileges``). cpu, memory and pids limits are the container cgroup's (capped at the
host's capacity), rlimits its ulimits; no network unless the task and the run allow it (then a
network of the trial's own). :meth:`ContainerTrial.finish` removes the agent's container (every
process it left goes with it); the verifier runs in a **fresh container** of the same image as
the verifier uid, with the workspace, ``/tests`` read-only, ``/logs/agent`` read-only and an
empty ``/logs/verifier`` (``Trial.run_verifier``'s contract, so rl/agent/verifier.py is the one
implementation for both backends). docs/containers.md.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import ctrf

from rl.agent.container import runtime
from rl.agent.container.images import Image
from rl.agent.sandbox.jail import _write_logs, wait_captured
from rl.agent.sandbox.limits import ExecResult, Limits, classify
from rl.agent.sandbox.trial import Trial, chown_tree, collect_files
from rl.agent.secrets import redact
from rl.errors import SandboxError

RUN_DIR = "/run/t1ops"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def host_capped(limits: Limits) -> tuple[int, float | None]:
    """(memory_mb, cpus) of ``limits`` capped at this host's memory and cores."""
    host_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    cpus = None if limits.cpus is None else min(limits.cpus, float(os.cpu_count() or 1))
    return min(limits.memory_mb, host_mb), cpus


# what root of a verifier's runtime needs to install packages (apt drops to _apt, pip chowns):
# nothing that reaches past the container (no SYS_ADMIN, NET_ADMIN, SYS_PTRACE, MKNOD ...)
ROOT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL")


def run_args(trial_id: str, run_id: str, limits: Limits, network: str, binds: list[tuple[Path, str, str]],
             workdir: str, *, as_root_runtime: bool = False) -> list[str]:
    """``podman run`` options shared by the agent's and the verifier's containers;
    ``as_root_runtime``: a writable root and :data:`ROOT_CAPS` (a networked task's verifier)."""
    mem, cpus = host_capped(limits)
    # an image VOLUME is a tmpfs of this container (issue #51): charged to its memory limit,
    # gone with it; never an anonymous volume on the host's disk outside storage_mb
    root = [a for c in ROOT_CAPS for a in ("--cap-add", c)] if as_root_runtime else ["--read-only"]
    args = [*runtime.labels(run_id, trial_id), "--network", network, *root, "--image-volume", "tmpfs",
            "--cap-drop=ALL", "--security-opt", "no-new-privileges", "--memory", f"{mem}m",
            "--memory-swap", f"{mem}m", "--pids-limit", str(limits.num_procs),
            "--ulimit", f"nofile={limits.num_open_files}:{limits.num_open_files}",
            "--ulimit", f"fsize={limits.file_size_mb * 2**20}:{limits.file_size_mb * 2**20}",
            "--ulimit", f"cpu={limits.cpu_s}:{limits.cpu_s + 2}", "--ulimit", "core=0:0",
            "--ulimit", f"nproc={limits.num_procs}:{limits.num_procs}", "--hostname", "trial",
            "--workdir", workdir]
    if cpus is not None:
        args += ["--cpus", f"{cpus:g}"]
    for host, dst, mode in binds:
        args += ["-v", f"{host}:{dst}:{mode}"]
    return args


def cgroup_counters(pid: int | None) -> dict[str, int]:
    """``oom_kill`` / ``pids_max`` of the container's cgroup (podman's OOMKilled is unreliable)."""
    out = {"oom_kill": 0, "pids_max": 0}
    if not pid:
        return out
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return out
    paths = {ctrl: p for _, ctrls, p in (ln.split(":", 2) for ln in lines) for ctrl in ctrls.split(",")}
    for ctrl, fname, key, field_ in (("memory", "memory.oom_control", "oom_kill", "oom_kill"),
                                     ("pids", "pids.events", "pids_max", "max")):
        try:
            text = Path(f"/sys/fs/cgroup/{ctrl}{paths.get(ctrl, '/nonexistent')}/{fname}").read_text()
        except OSError:
            continue
        for ln in text.splitlines():
            if ln.startswith(field_ + " "):
                out[key] = int(ln.split()[1])
    return out


def run_captured(argv: list[str], *, env: Mapping[str, str], limits: Limits, timeout_s: float,
                 log_dir: Path, secrets: Mapping[str, str], on_timeout, budget_cut: bool = False,
                 pid: int | None = None) -> ExecResult:
    """Run a podman client command; output capped and redacted; ``on_timeout()`` kills what it
    started inside the container (killing the client alone would not)."""
    before = cgroup_counters(pid)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    rc, timed_out, out, err = wait_captured(proc, limits.max_output_bytes, timeout_s, on_timeout=on_timeout)
    stdout, stderr = redact(out.text(), secrets), redact(err.text(), secrets)
    _write_logs(log_dir, stdout, stderr)
    after = cgroup_counters(pid)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    if rc in (125, 126, 127) and stderr.startswith("Error:"):   # podman's own failure, not the command's
        raise SandboxError(f"the container runtime refused the command: {stderr.strip()[:300]}")
    reason = classify(rc, stderr, timed_out, budget_cut, delta)
    if rc == 137 and not timed_out and reason == "exit_nonzero":
        reason = "memory_limit" if delta.get("oom_kill") else reason
    return ExecResult(stdout, stderr, None if timed_out else rc, reason, time.monotonic() - t0,
                      out.total > limits.max_output_bytes or err.total > limits.max_output_bytes)


@dataclass(eq=False)
class ContainerTrial(Trial):
    """A :class:`Trial` whose commands run in a container of the task's image (module doc)."""

    image: Image | None = None
    container: str = ""
    net_name: str = ""
    shell: str = "/bin/bash"
    container_pid: int | None = None
    image_env: dict[str, str] = field(default_factory=dict)
    mcp_tools: dict[str, list[str]] = field(default_factory=dict)

    def agent_env(self) -> dict[str, str]:
        return {**super().agent_env(), "PATH": self.image_env.get("PATH", DEFAULT_PATH)}

    def verifier_path(self) -> str:
        return self.image_env.get("PATH", DEFAULT_PATH)

    def _network(self) -> str:
        return self.net_name or "none"

    def _binds(self) -> list[tuple[Path, str, str]]:
        fs = self.fs
        binds = [(self.workspace, self.workdir, "rw"), (fs / "tmp", "/tmp", "rw"),
                 (fs / "var_tmp", "/var/tmp", "rw"), (fs / "shm", "/dev/shm", "rw"),
                 (fs / "logs_agent", "/logs/agent", "rw")]
        if self.oracle:
            binds.append((self.dir / "solution", "/solution", "ro"))
        return binds

    def start(self) -> None:
        """Start the agent's container (PID 1: ``sleep`` as root, no capabilities)."""
        args = run_args(self.trial_id, self.run_id, self.limits, self._network(), self._binds(),
                        self.workdir)
        runtime.podman("run", "-d", "--name", self.container, "--user", "0:0", *args,
                       "--entrypoint", "sleep", self.image.tag, "infinity", timeout=120)
        pid = runtime.podman("inspect", "--format", "{{.State.Pid}}", self.container, timeout=60)
        self.container_pid = int(pid.stdout.strip() or 0) or None

    def _run_command(self, cmd: str, timeout_s: float, *, budget_cut: bool) -> ExecResult:
        """The agent's command by ``exec`` in the trial's container, as its uid (Trial.exec keeps the budget)."""
        env = self.agent_env()
        argv = [runtime.cli(), "exec", "--user", f"{self.uid}:{self.uid}", "--workdir", self.workdir,
                *[a for k in env for a in ("-e", k)], self.container, self.shell, "-c", cmd]
        return run_captured(argv, env=env, limits=self.limits, timeout_s=timeout_s,
                            log_dir=self.dir / "logs", secrets=self.secrets,
                            on_timeout=self._kill_agent, budget_cut=budget_cut, pid=self.container_pid)

    def _kill_agent(self) -> None:
        """SIGKILL every process of the agent uid in the container (``kill -9 -1`` as that uid)."""
        runtime.podman("exec", "--user", f"{self.uid}:{self.uid}", self.container, "/bin/sh", "-c",
                       "kill -9 -1", timeout=30, check=False)

    def finish(self) -> int:
        """End the agent's part: its container goes, with every process it left running."""
        if not self.finished and self.container:
            runtime.remove_container(self.container)
        self.finished = True
        return 0

    def run_verifier(self, argv: list[str], *, env: Mapping[str, str], limits: Limits,
                     timeout_s: float, tests: Path, vdir: Path,
                     files: tuple[tuple[str, str], ...] = ()) -> ExecResult:
        """``Trial.run_verifier``'s contract in a fresh container of the same image."""
        self.finish()
        out_dir = self.fs / "logs_verifier"
        out_dir.mkdir(mode=0o755)
        for name in ("workspace", "vtmp", "logs_verifier"):
            chown_tree(self.fs / name, self.verifier_uid, owner_rw=True)
        run_dir = self._run_dir(files)
        binds = [(self.workspace, self.workdir, "rw"), (out_dir, "/logs/verifier", "rw"),
                 (self.fs / "vtmp", "/tmp", "rw"), (self.fs / "vtmp", "/var/tmp", "rw"),
                 (self.fs / "vtmp", "/dev/shm", "rw"), (tests, "/tests", "ro"),
                 (self.fs / "logs_agent", "/logs/agent", "ro"), (run_dir, RUN_DIR, "ro")]
        name = f"{self.container}-verifier"
        # the CTRF plugin first, then the task's [verifier.env] PYTHONPATH as declared (issue #51)
        env = {**env, "PYTHONPATH": ":".join(filter(None, (f"{RUN_DIR}/py", env.get("PYTHONPATH"))))}
        # a task that declares the network (and a run that allows it) gets Harbor's verifier: root of
        # a fresh, writable container of its image on the trial's egress network (no host address),
        # discarded with the verdict; any other verifier is unprivileged, offline, on a read-only root
        networked = bool(self.net_name)
        args = run_args(self.trial_id, self.run_id, limits, self._network() if networked else "none", binds,
                        self.workdir, as_root_runtime=networked)
        user = "0:0" if networked else f"{self.verifier_uid}:{self.verifier_uid}"
        # --unsetenv-all: the image's ENV (BASH_ENV, a PATH into /app/.venv ...) never applies;
        # the verifier's environment is exactly the one rl/agent/verifier.py wrote
        cmd = [runtime.cli(), "run", "--rm", "--name", name, "--user", user, "--unsetenv-all", *args,
               *[a for k in env for a in ("-e", k)], "--entrypoint", argv[0], self.image.tag, *argv[1:]]
        try:
            return run_captured(cmd, env=env, limits=limits, timeout_s=timeout_s,
                                log_dir=self.dir / "logs", secrets=self.secrets,
                                on_timeout=lambda: runtime.remove_container(name))
        finally:
            runtime.remove_container(name)
            collect_files(out_dir, vdir, secrets=self.secrets)   # redacted before it is written (#28)

    def _run_dir(self, files: tuple[tuple[str, str], ...]) -> Path:
        """``/run/t1ops`` for the verifier (root-owned, read-only in the container): the pinned
        pytest ini and the CTRF plugin (``py/ctrf``, pure Python, the host's copy)."""
        d = self.dir / ".root" / "run_t1ops"
        shutil.copytree(Path(ctrf.__file__).parent, d / "py" / "ctrf",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for path, text in files:
            rel = os.path.relpath(path, RUN_DIR)
            if rel.startswith(".."):
                raise SandboxError(f"verifier file {path} must live under {RUN_DIR}", path=path)
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
        for p in [d, *d.rglob("*")]:
            os.chmod(p, 0o555 if p.is_dir() else 0o444)
        return d

    def close(self) -> None:
        if self.closed:
            return
        self.finish()
        if self.net_name:
            runtime.podman("network", "rm", "-f", self.net_name, timeout=60, check=False)
        self.closed = True
        if self._release is not None:
            self._release()


def populate_from_image(image: Image, workdir: str, workspace: Path, run_id: str) -> None:
    """Copy the image's ``workdir`` (what the Dockerfile put there) into the trial workspace."""
    name = f"t1ops-populate-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
    runtime.podman("create", "--name", name, *runtime.labels(run_id), "--image-volume", "ignore", "--entrypoint", "true",
                   image.tag, timeout=120)
    try:
        res = runtime.podman("cp", f"{name}:{workdir}/.", str(workspace), timeout=300, check=False)
        if res.returncode != 0 and "no such file or directory" not in res.stderr.lower():
            raise SandboxError(f"cannot copy {workdir} out of image {image.tag}: {res.stderr.strip()[:300]}")
    finally:
        runtime.remove_container(name)


def has_file(image: Image, path: str, run_id: str) -> bool:
    res = runtime.podman("run", "--rm", *runtime.labels(run_id), "--network", "none", "--image-volume", "ignore",
                         "--entrypoint", "/bin/sh", image.tag, "-c", f"test -x {path}",
                         timeout=60, check=False)
    return res.returncode == 0


def trial_record(trial: ContainerTrial) -> str:
    return json.dumps({"image": trial.image.tag, "image_key": trial.image.key,
                       "container": trial.container, "network": trial._network()})
