"""The ``container`` environment backend: the :class:`~rl.agent.environment.Environment`
protocol over a real OCI runtime (images.py builds, trial.py runs).

:meth:`ContainerEnvironment.check` says what a task needs that this host cannot give (no
runtime, GPUs, the network when the run allows none) and, per ``FROM`` name, whether it is on
this host and whether a stand-in (``t1ops images seed``) satisfies it. :func:`create_trial`
builds (or finds) the image, lays the trial out as the local backend does, fills the workspace
with the image's WORKDIR and starts the container. Creation is paced by the caller's token
bucket; :data:`MAX_CONCURRENT_STARTS` bounds containers being created at once. The first
backend of a process removes the containers and networks of dead runs (runtime.reap).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Mapping

from rl.agent import dockerfile
from rl.agent.container import egress, images, runtime
from rl.agent.container.mcp import start_mcp_servers
from rl.agent.container.trial import ContainerTrial, populate_from_image
from rl.agent.environment import DEFAULT_WORKDIR, EnvironmentCheck, _compose_needs
from rl.agent.sandbox.isolation import Isolation
from rl.agent.sandbox.limits import Limits
from rl.agent.sandbox.trial import lay_out_agent_dirs, open_trial_dir, release, unmount
from rl.agent.task_toml import workdir_problem
from rl.agent.tasks import Budget, Task
from rl.errors import SandboxError

_log = logging.getLogger(__name__)
MAX_CONCURRENT_STARTS = int(os.environ.get("T1OPS_MAX_CONTAINER_STARTS", "8"))
_STARTS = threading.BoundedSemaphore(MAX_CONCURRENT_STARTS)
_REAPED = threading.Event()


def reap_dead_once() -> list[runtime.Leftover]:
    """Remove what dead runs left (first call per process only)."""
    if _REAPED.is_set():
        return []
    _REAPED.set()
    gone = runtime.reap(only_dead=True)
    if gone:
        _log.warning("removed %d leftover(s) of dead runs: %s", len(gone),
                     ", ".join(f"{x.kind} {x.name} (run {x.run_id})" for x in gone))
    return gone


class ContainerEnvironment:
    """The container backend (module doc)."""

    name = "container"

    def check(self, task: Task, *, allow_internet: bool = False) -> EnvironmentCheck:
        needs: list[str] = []
        notes: list[str] = []
        ok, why = runtime.available()
        if not ok:
            needs.append(f"needs a container runtime ({why})")
        path = task.environment_dir / "Dockerfile"
        workdir = task.workdir
        if task.docker_image:
            needs.append(f"prebuilt image {task.docker_image!r} is not supported yet: give the task "
                         "an environment/Dockerfile")
        elif not path.is_file():
            notes.append(f"no environment/Dockerfile: the shared default image "
                         f"({images.DEFAULT_BASE} + pytest), environment/ copied into the workspace")
        else:
            text = path.read_text(errors="replace")
            workdir = workdir or dockerfile.image_settings(text)[0]
            if ok:
                for f in images.from_report(text):
                    if not f.present:
                        notes.append(f"line {f.line}: FROM {f.name}: not on this host; the build "
                                     f"pulls it (no registry here? `t1ops images seed {f.resolved}`)")
                    elif f.standin or f.note:
                        notes.append(f"line {f.line}: FROM {f.name}: {f.note}")
        needs += _compose_needs(task)
        if task.gpus:
            needs.append(f"needs {task.gpus} GPU(s) ([environment] gpus)")
        if task.allow_internet is True and not allow_internet:
            needs.append("needs network (allow_internet = true; this run allows none)")
        if images.task_settings(task).get("mcp_servers"):
            notes.append("mcp_servers start inside the container; the agent waits for tools/list")
        if not workdir or workdir == "/":
            workdir = DEFAULT_WORKDIR
        return EnvironmentCheck(task.name, self.name, tuple(needs), tuple(notes), workdir, None)

    def populate(self, task: Task, workspace: Path) -> None:
        if not (task.environment_dir / "Dockerfile").is_file():
            shutil.copytree(task.environment_dir, workspace, symlinks=True, dirs_exist_ok=True)
            return
        img = images.build(task)
        populate_from_image(img, _workdir(task, img), workspace, "populate")


CONTAINER = ContainerEnvironment()


def _workdir(task: Task, img: images.Image) -> str:
    wd = task.workdir or img.workdir or DEFAULT_WORKDIR
    return DEFAULT_WORKDIR if wd == "/" else wd


# where the container trial mounts its own trees (the workspace may not be there or above them),
# and the image's system trees the workspace mount would hide (below them is the image's business:
# WORKDIR /root or /usr/src/app is common in public images and harmless inside a container)
CONTAINER_MOUNTS = ("/dev", "/dev/shm", "/logs", "/proc", "/solution", "/sys", "/tests", "/tmp", "/var/tmp")
IMAGE_TREES = ("/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/root", "/run", "/sbin", "/usr", "/var")


def _workdir_problem(wd: str) -> str | None:
    """The local backend's WORKDIR rule (docs/sandbox.md, class 3) with the container's mounts."""
    problem = workdir_problem(wd, system_dirs=CONTAINER_MOUNTS)
    if problem is None and wd.rstrip("/") in IMAGE_TREES:
        problem = f"{wd!r} is the image's system tree: the workspace mount would hide it; use a directory like /app"
    return problem


def create_trial(*, task: Task, run_id: str, trial_idx: int, tdir: Path, budget: Budget,
                 limits: Limits, isolation: Isolation, secrets: dict[str, str], network: bool,
                 oracle: bool, env: Mapping[str, str], workdir: str | None = None) -> ContainerTrial:
    """Lay out ``tdir`` (created, empty), build or find the image, start the container."""
    reap_dead_once()
    own = (task.environment_dir / "Dockerfile").is_file()
    img = images.build(task) if own else images.build_default(run_id)   # ImageBuildError: build-failed
    wd = workdir or _workdir(task, img)
    if _workdir_problem(wd):
        raise SandboxError(f"WORKDIR {_workdir_problem(wd)}", workdir=wd[:200])
    uid, vuid = open_trial_dir(tdir, limits)
    trial_id = tdir.name
    trial = None
    try:
        if own:
            populate_from_image(img, wd, tdir / "fs" / "workspace", run_id)
        elif task.environment_dir.is_dir():
            shutil.copytree(task.environment_dir, tdir / "fs" / "workspace", symlinks=True,
                            dirs_exist_ok=True)
        lay_out_agent_dirs(task, tdir, uid, oracle)
        name = f"t1ops-{trial_id}"[:120]
        trial = ContainerTrial(task=task, run_id=run_id, trial_idx=trial_idx, trial_id=trial_id,
                               dir=tdir, budget=budget, limits=limits, isolation=isolation, uid=uid,
                               verifier_uid=vuid, network=network, workdir=wd, oracle=oracle,
                               secrets=secrets, env={**dict(env)}, image=img, container=name,
                               image_env=img.env)
        if network:
            trial.net_name = f"{name}-net"
            egress.create_network(trial.net_name, runtime.labels(run_id, trial_id))   # no host address
        if not _has_bash(img, run_id):
            trial.shell = "/bin/sh"
        with _STARTS:
            trial.start()
        start_mcp_servers(trial)
    except BaseException:
        if trial is not None:
            trial.finish()
            if trial.net_name:
                runtime.podman("network", "rm", "-f", trial.net_name, timeout=60, check=False)
        unmount(tdir / "fs")
        raise
    (tdir / "trial.json").write_text(json.dumps({
        "run_id": run_id, "trial_id": trial_id, "task": task.name, "trial_idx": trial_idx,
        "backend": "container", "image": img.tag, "image_key": img.key, "image_cached": img.cached,
        "container": trial.container, "agent_budget_s": budget.timeout_s,
        "budget_source": budget.source, "tests_digest": task.tests_digest, "uid": uid,
        "verifier_uid": vuid, "network": network, "workdir": wd, "oracle": oracle,
        "isolation": isolation.level, "limits": limits.__dict__}, indent=1))
    import weakref
    trial._release = weakref.finalize(trial, _release, trial.container, trial.net_name, trial.fs)
    return trial


def _release(container: str, net: str, fs: Path) -> None:
    runtime.remove_container(container)
    if net:
        runtime.podman("network", "rm", "-f", net, timeout=60, check=False)
    release(fs, None)


_BASH: dict[str, bool] = {}


def _has_bash(img: images.Image, run_id: str) -> bool:
    if img.key not in _BASH:
        from rl.agent.container.trial import has_file
        _BASH[img.key] = has_file(img, "/bin/bash", run_id)
    return _BASH[img.key]
