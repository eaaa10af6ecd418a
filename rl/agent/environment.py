"""The task environment seam: what a task's ``environment/`` becomes before the agent starts.

Harbor builds ``environment/Dockerfile`` into an image and runs the trial in a container.
t1ops has one backend today, :class:`LocalEnvironment`: no image; it applies the parts
of the Dockerfile it can honour on this host (rl/agent/dockerfile.py: ``WORKDIR``,
``COPY``/``ADD`` from environment/, ``ENV``, ``ARG``, ``mkdir``, installs of packages
already present) and refuses the rest, naming the line and why. A task without a
Dockerfile gets its whole ``environment/`` copied into the workspace (the bundled pool).

The container backend (rl/agent/container/backend.py, docs/containers.md) implements the
same :class:`Environment` protocol: it builds the image and runs each trial in a container.
docs/tasks.md describes the seam.
"""
from __future__ import annotations

import posixpath
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import yaml

from rl.agent import dockerfile
from rl.agent.tasks import Task
from rl.errors import TaskError

DEFAULT_WORKDIR = "/app"


@dataclass(frozen=True)
class EnvironmentCheck:
    """Whether a task can run on this backend: ``needs`` says what it lacks, one reason per
    line ("needs a container runtime (line 4: RUN curl ...)", "needs network ...")."""

    task: str
    backend: str
    needs: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    workdir: str = DEFAULT_WORKDIR
    plan: dockerfile.Plan | None = field(default=None, repr=False, compare=False)

    @property
    def runs_locally(self) -> bool:
        return not self.needs


class Environment(Protocol):
    """A backend that turns a task's environment/ into a workspace its commands run in."""

    name: str

    def check(self, task: Task, *, allow_internet: bool = False) -> EnvironmentCheck:
        """What the task needs that this backend cannot give (never raises for the task)."""

    def populate(self, task: Task, workspace: Path) -> None:
        """Fill an empty ``workspace`` (the trial's WORKDIR) as the image build would."""


class LocalEnvironment:
    """The host backend (module doc)."""

    name = "local"

    def check(self, task: Task, *, allow_internet: bool = False) -> EnvironmentCheck:
        needs: list[str] = []
        notes: list[str] = []
        plan = _plan(task)
        if plan is not None:
            needs += [f"needs a container runtime ({r})" for r in plan.refusals]
            notes += plan.notes
        needs += _compose_needs(task)
        if task.docker_image:
            needs.append(f"needs a container runtime (prebuilt image {task.docker_image!r})")
        if task.gpus:
            needs.append(f"needs {task.gpus} GPU(s) ([environment] gpus)")
        if task.allow_internet is True and not allow_internet:
            needs.append("needs network (allow_internet = true; this run allows none)")
        elif task.allow_internet is None:
            notes.append("allow_internet not declared (Harbor's default is true): runs without "
                         "network here")
        workdir = task.workdir or (plan.workdir if plan else None) or DEFAULT_WORKDIR
        return EnvironmentCheck(task.name, self.name, tuple(needs), tuple(notes), workdir, plan)

    def populate(self, task: Task, workspace: Path) -> None:
        plan = _plan(task)
        workspace.mkdir(parents=True, exist_ok=True)
        if plan is None:
            if task.environment_dir.is_dir():
                shutil.copytree(task.environment_dir, workspace, symlinks=True, dirs_exist_ok=True)
            return
        if plan.refusals:
            raise TaskError(f"{task.name}: the local backend cannot build environment/Dockerfile: "
                            + "; ".join(plan.refusals), task=task.name)
        workdir = plan.workdir or DEFAULT_WORKDIR
        for src, dest in plan.copies:
            _copy_into(task.environment_dir / src, workspace, dest)
        for d in plan.mkdirs:
            (workspace / posixpath.relpath(d, workdir)).mkdir(parents=True, exist_ok=True)


def _compose_needs(task: Task) -> list[str]:
    """A docker-compose file with more than one service (a database, a server) needs them."""
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        path = task.environment_dir / name
        if not path.is_file():
            continue
        try:
            doc = yaml.safe_load(path.read_text(errors="replace")) or {}
        except yaml.YAMLError as e:
            return [f"needs a container runtime ({name} is not valid YAML: {e})"]
        services = doc.get("services") if isinstance(doc, dict) else None
        if isinstance(services, dict) and len(services) > 1:
            return [f"needs a container runtime ({name} starts {len(services)} services: "
                    f"{', '.join(sorted(services))})"]
    return []


def _plan(task: Task) -> dockerfile.Plan | None:
    path = task.environment_dir / "Dockerfile"
    if not path.is_file():
        return None
    return dockerfile.plan(path.read_text(errors="replace"), task.environment_dir)


def _copy_into(src: Path, workspace: Path, dest: str) -> None:
    target = (workspace / dest).resolve() if dest != "." else workspace.resolve()
    if not target.is_relative_to(workspace.resolve()):
        raise TaskError(f"COPY destination {dest!r} leaves the workspace", dest=dest)
    if src.is_dir():
        shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target if not target.is_dir() else target / src.name)


LOCAL = LocalEnvironment()


def check_pool(tasks: list[Task], *, allow_internet: bool = False,
               backend: Environment = LOCAL) -> list[EnvironmentCheck]:
    """One :class:`EnvironmentCheck` per task (``t1ops tasks check``, campaign start)."""
    return [backend.check(t, allow_internet=allow_internet) for t in tasks]


def require_runnable(tasks: list[Task], *, allow_internet: bool = False,
                     backend: Environment = LOCAL) -> None:
    """TaskError naming every task this backend cannot run and why (fail before trials)."""
    bad = [c for c in check_pool(tasks, allow_internet=allow_internet, backend=backend)
           if not c.runs_locally]
    if bad:
        raise TaskError(f"{len(bad)} task(s) cannot run on the {backend.name} backend: "
                        + "; ".join(f"{c.task}: {', '.join(c.needs)}" for c in bad)
                        + "; remove them from the pool or run them where a container runtime is",
                        tasks=[c.task for c in bad])
