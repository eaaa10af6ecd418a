"""Local sandbox: every command of a trial in fresh namespaces, as an unprivileged per-trial uid.

:class:`Sandbox` creates trials under ``<root>/<run_id>/``; a :class:`Trial` runs the agent's
commands (:meth:`Trial.exec`) and, after it, the verifier (:meth:`Trial.run_verifier`), each
in its own namespace set (``jail.py``/``jail_init.py``) with the trial's limits (``limits.py``,
``cgroup.py``). The isolation in effect is probed once (``isolation.py``) and a sandbox refuses
to start below the level it is asked for. Threat model and fallbacks: docs/sandbox.md.
"""
from __future__ import annotations

import json
import logging
import os
import weakref
import uuid
from pathlib import Path
from typing import Mapping

from rl.agent.environment import LocalEnvironment
from rl.agent.sandbox.isolation import (AGENT_UID, LEVELS, VERIFIER_UID, Isolation,
                                        probe_isolation, require)
from rl.agent.sandbox.jail import PINNED_PYTEST_INI, View, run_jailed
from rl.agent.sandbox.limits import LIMIT_REASONS, VERIFIER_LIMITS, ExecResult, Limits, classify
from rl.agent.sandbox.trial import Trial, create_trial, task_limits
from rl.agent.secrets import MIN_SECRET_CHARS, collect_secrets
from rl.agent.task_toml import workdir_problem
from rl.agent.tasks import Task, effective_timeout, name_problem
from rl.errors import InputError, SandboxError, TaskError, TrialDirError

__all__ = ["AGENT_UID", "LEVELS", "LIMIT_REASONS", "PINNED_PYTEST_INI", "VERIFIER_LIMITS",
           "VERIFIER_UID", "ExecResult", "Isolation", "Limits", "Sandbox", "Trial", "View",
           "classify", "make_sandbox", "probe_isolation", "require_isolation", "run_jailed"]

log = logging.getLogger("rl.agent.sandbox")

# docs/sandbox.md "Network": a trial never shares the host's network namespace (host
# loopback, Ray's endpoints, abstract unix sockets); egress needs a user-mode network stack
NO_EGRESS_REASON = ("this build gives a trial no egress-only network namespace (no slirp4netns or "
                    "pasta here, and a trial never shares the host's network namespace: its loopback "
                    "services and abstract unix sockets would be reachable); run the task without "
                    "network, or on the container backend")


class Sandbox:
    """Creates trials under ``<root>/<run_id>/``; one per campaign (or per rollout worker).

    ``isolation``: the weakest level accepted (``strict`` | ``namespaces`` | ``none``);
    ``allow_internet``: whether a task that asks for the network (``allow_internet``) gets it.
    """

    def __init__(self, root: str | Path, run_id: str, *, limits: Limits = Limits(),
                 isolation: str = "strict", allow_internet: bool = False,
                 agent_timeout_override_s: float | None = None, allow_lower_timeout: bool = False,
                 environ: Mapping[str, str] | None = None, isolate_network: bool = True,
                 drop_privileges: bool = True, hide_task_pool: bool = True,
                 env_allow: tuple[str, ...] | list[str] = (), backend: str = "local") -> None:
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise InputError(f"run_id {run_id!r} must be a non-empty name without '/'", argument="run_id")
        if not drop_privileges or not hide_task_pool:
            raise SandboxError("drop_privileges=False / hide_task_pool=False are gone: nothing of "
                               "a task runs as root and the task pool is never visible to a trial")
        if backend not in ("local", "container"):
            raise InputError(f"environment backend {backend!r}: use 'local' or 'container'",
                             argument="backend")
        self.backend = backend
        reaped = []
        if backend == "container":   # what SIGKILLed runs left goes first (docs/containers.md)
            from rl.agent.container.backend import reap_dead_once
            reaped = reap_dead_once()
        self.isolation = probe_isolation()
        require(self.isolation, isolation)
        if self.isolation.level == "none":
            raise SandboxError("isolation level 'none' has no runner in this build: run as root "
                               "(docs/sandbox.md)")
        self.root, self.run_id, self.limits = Path(root).resolve(), run_id, limits
        self.run_dir = self.root / run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.run_dir, 0o711)   # traversable, not listable
        if reaped:   # the record of what this run removed (a worker's log does not reach the driver)
            (self.run_dir / "reaped-leftovers.json").write_text(json.dumps(
                [{"kind": x.kind, "name": x.name, "run_id": x.run_id} for x in reaped]))
        self.override_s, self.allow_lower = agent_timeout_override_s, allow_lower_timeout
        self.environ = os.environ if environ is None else environ
        self.allow_internet = allow_internet or not isolate_network
        self.env_allow = frozenset(env_allow)   # host variables [environment.env] templates may read
        self._open: "weakref.WeakSet[Trial]" = weakref.WeakSet()

    def close_all(self) -> int:
        """Close every trial of this sandbox still open (a shutting-down worker's in-flight
        trials: a SIGKILLed process cannot unmount its trials' tmpfs). Returns how many."""
        trials = [t for t in list(self._open) if not t.closed]
        for t in trials:
            t.close()
        return len(trials)

    def create(self, task: Task, trial_idx: int, *, oracle: bool = False, workdir: str | None = None,
               limits: Limits | None = None, env: Mapping[str, str] | None = None) -> Trial:
        """A fresh trial with the task's environment/ in its workspace (at ``workdir``, default
        the task's ``workdir`` or ``/app``); ``oracle`` mounts its solution/ at /solution."""
        budget = effective_timeout(task.agent_timeout_s, self.override_s,
                                   allow_lower=self.allow_lower, what=f"agent[{task.name}]")
        bad_name = name_problem(task.name)
        if bad_name:
            raise TaskError(bad_name, task=task.name[:80])
        wd = workdir or LocalEnvironment().check(task).workdir
        if workdir_problem(wd):
            raise SandboxError(f"task {task.name}: WORKDIR {workdir_problem(wd)}", workdir=wd[:200])
        secrets = collect_secrets(task.required_env_keys, self.environ)
        if env is None:
            env, taken = task.resolved_env(self.environ, self.env_allow)
            # a value read from the campaign's environment is redacted like a declared secret
            secrets.update({f"env:{k}": v for k, v in taken.items() if len(v) >= MIN_SECRET_CHARS})
        wants_net = task.allow_network
        if wants_net and self.allow_internet and self.backend == "local":   # a container gets its own network
            raise SandboxError(f"task {task.name} asks for the network and this sandbox allows it, but "
                               f"{NO_EGRESS_REASON}", task=task.name, reason="no-egress-namespace")
        tdir = self.run_dir / f"{task.name}-{trial_idx}-{uuid.uuid4().hex[:8]}"
        try:
            tdir.mkdir(mode=0o755)
        except FileExistsError as e:
            raise TrialDirError(f"trial dir {tdir} already exists; trial dirs are never reused",
                                path=str(tdir)) from e
        if wants_net and not self.allow_internet:
            log.warning("sandbox: task %s asks for the network; this sandbox gives none "
                        "(allow_internet = false)", task.name)
        if self.backend == "container":   # the task's image, in a container (docs/containers.md)
            from rl.agent.container.backend import create_trial as create_container_trial
            trial = create_container_trial(
                task=task, run_id=self.run_id, trial_idx=trial_idx, tdir=tdir, budget=budget,
                limits=task_limits(limits or self.limits, task), isolation=self.isolation,
                secrets=secrets, network=wants_net and self.allow_internet, oracle=oracle,
                env=env, workdir=workdir)
            self._open.add(trial)
            return trial
        trial = create_trial(
            task=task, run_id=self.run_id, trial_idx=trial_idx, tdir=tdir, budget=budget,
            limits=task_limits(limits or self.limits, task), isolation=self.isolation,
            secrets=secrets, network=False, workdir=wd, oracle=oracle, env=env)
        self._open.add(trial)
        return trial


def require_isolation(level: str) -> Isolation:
    """The probed isolation, or SandboxError if it is weaker than ``level`` (``t1ops run``
    calls this before anything starts)."""
    iso = probe_isolation()
    require(iso, level)
    return iso


def make_sandbox(root: str | Path, run_id: str, cfg: Mapping, **kw) -> Sandbox:
    """A Sandbox from ``SandboxConfig`` fields (``t1ops.config``): limits, isolation, network."""
    names = ("memory_mb", "cpus", "storage_mb", "num_files", "num_procs", "cpu_s")
    limits = Limits(**{k: cfg[k] for k in names if k in cfg})
    return Sandbox(root, run_id, limits=limits, isolation=cfg.get("isolation", "strict"),
                   allow_internet=cfg.get("allow_internet", False),
                   env_allow=tuple(cfg.get("env_allow", ())), backend=cfg.get("backend", "local"),
                   **kw)
