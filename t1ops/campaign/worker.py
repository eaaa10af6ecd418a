"""The rollout worker: one per node, hosting the agent loop and its sandboxes.

Trials run here, not on the coordinator, so trial traffic stays off it (the
report: "trials are hosted by per-node Ray auxiliary workers pinned to rollout
nodes"). A worker runs one step's trials concurrently on an asyncio loop:
sandbox creation goes through the loop-keyed :class:`TokenBucket`, every trial
is booked in a :class:`TrialLedger` (completed, failed with its error, or
cancelled with a reason: nothing vanishes), and skim over-sampling accepts the
first groups to finish and cancels the tail, counted per family.

Generation goes straight to the engines (``t1ops.engines.direct``), with
membership and health from the engine router (``t1ops.campaign.engines``): a
request whose engine died is resubmitted to a live engine, never lost; when
the pool runs out of engines the trial fails loudly and the ledger names it.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import math
import os
import random
import threading
import time
from dataclasses import asdict, dataclass, field

from rl.agent.environment import require_runnable
from rl.agent.loop import AgentSettings, run_episode
from rl.agent.sandbox import make_sandbox
from rl.agent.tasks import load_pool
from rl.agent.verdict import is_solved
from rl.agent.verifier import verify_within
from rl.chat import ChatRenderer
from rl.engines.client import EngineClient
from rl.errors import RoutingError
from rl.harness.command_agent import HarnessSettings
from t1ops import telemetry
from t1ops.campaign.async_worker import run_group, stop_groups
from t1ops.campaign.dataplane import stage, write_dump_items
from t1ops.campaign.evaluation import eval_agent, run_on_own_loop
from t1ops.campaign.trials import BatchResult, GroupResult, TrialResult, TrialSpec, failed_row, request_seed, seeded
from t1ops.campaign.trialtrace import TrialClock
from t1ops.config import EngineConfig, EnvironmentConfig, RolloutConfig, RunConfig, SandboxConfig
from t1ops.engines.direct import DirectEngines
from t1ops.guards.fds import raise_nofile_limit
from t1ops.guards.field_config import FieldGuardsConfig
from t1ops.guards.http import BoundedHttp
from t1ops.guards.infra_verdict import check_verdict
from t1ops.guards.pacing import SkimAccounting, TokenBucket, TrialLedger


class Cancelled(Exception):
    """A skimmed trial stopped at its next turn boundary."""


@dataclass(frozen=True)
class WorkerSettings:
    """What a rollout worker runs by: the config sections as declared (``t1ops.config``; pydantic,
    they pickle to the actor as they are), never copied field by field, and what derives from them."""

    agent: AgentSettings             # the agent loop's limits: rollout's AgentLimits + the R3 layout (launch)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)   # [rollout]: concurrency, pacing, skim, rewards
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)   # [sandbox]: isolation, network, limits
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)  # [environment]: the backend
    field_guards: FieldGuardsConfig = field(default_factory=FieldGuardsConfig)  # [guards.field]: verifier cap
    run: RunConfig = field(default_factory=RunConfig)   # [run]: the seed of every request (rollout.seed_requests)
    harness: "HarnessSettings | None" = None  # rollout.agent = "command" (t1ops.campaign.harness)

    @classmethod
    def from_config(cls, cfg, agent: AgentSettings, harness: "HarnessSettings | None" = None) -> "WorkerSettings":
        """The sections of a ``CampaignConfig`` a worker reads, as they are."""
        return cls(agent=agent, rollout=cfg.rollout, sandbox=cfg.sandbox, environment=cfg.environment,
                   field_guards=cfg.guards.field, run=cfg.run, harness=harness)

    @property
    def seed(self) -> int | None:
        """The run seed each request's sampling seed derives from (t1ops.campaign.trials.request_seed);
        None: unseeded (``rollout.seed_requests = false``)."""
        return self.run.seed if self.rollout.seed_requests else None

    def sandbox_fields(self) -> dict:
        """The sandbox's settings as ``rl.agent.sandbox.make_sandbox`` takes them (rl reads no t1ops config)."""
        return {**self.sandbox.model_dump(), "backend": self.environment.backend}


def direct_engines(router, max_concurrency: int) -> DirectEngines:
    """Requests straight to the engines; the router actor only answers the view and failure reports."""
    import ray

    conf = ray.get(router.client_config.remote())
    cfg = EngineConfig(**conf["engine_cfg"])
    http = BoundedHttp.from_config(cfg)
    view_timeout_s = cfg.request_timeout_s * cfg.request_attempts
    return DirectEngines(lambda: ray.get(router.view.remote(), timeout=view_timeout_s),
                         lambda *args, **kw: ray.get(router.report_failure.remote(*args, **kw),  # the pool's verdict
                                                     timeout=view_timeout_s), cfg,
                         make_client=lambda url: EngineClient(url, http, **conf["client_kw"]),
                         max_concurrency=max(8, max_concurrency))


def _actor(handle_or_name):
    """A Ray actor handle from its name (a str), or the handle (or None) as given."""
    if not isinstance(handle_or_name, str):
        return handle_or_name
    import ray

    return ray.get_actor(handle_or_name)


class RolloutWorker:
    """Runs trials for the coordinator (wrapped as a Ray actor by the runner)."""

    #: Trial errors that abort the whole rollout instead of failing one trial: a dropped sample
    #: would condition the batch on "capture succeeded" (docs/failures.md, missing-routing). Any
    #: RoutingError (absent rows, a wrong row count, a row missing before a loss token), not only
    #: the missing kind: each is a capture that did not succeed (T1 report, section 05).
    ABORT_ON: tuple[type[BaseException], ...] = (RoutingError,)

    def __init__(self, *, run_id: str, trials_root: str, tasks_dir: str, settings: WorkerSettings,
                 router, node: str = "local", run_dir: str | None = None, index: int = 0,
                 telemetry_cfg: dict | None = None, store=None) -> None:
        if run_dir is not None:
            telemetry.setup(run_dir, role=f"worker-{index}", **(telemetry_cfg or {}))
        raise_nofile_limit()
        # the router and the trajectory store come as Ray actor names, looked up here on every
        # (re)start: an actor handle as a constructor argument of a restartable actor makes Ray log
        # an error at creation (ray-project/ray#53727; docs/campaign.md, "Ray's lifetime")
        router, store = _actor(router), _actor(store)
        self.run_id, self.settings, self.node, self.router = run_id, settings, node, router
        self.store, self.index = store, index  # trajectories go to the object store (t1ops.campaign.dataplane)
        r = settings.rollout
        self.engines = direct_engines(router, r.max_concurrency) if router is not None else None
        self.num_finished = 0
        self.tasks = {t.name: t for t in load_pool(tasks_dir)}
        # fail before any trial, naming each task and Dockerfile line the local backend cannot honour
        if settings.environment.backend == "container":
            from rl.agent.container.backend import CONTAINER as env_backend
        else:
            from rl.agent.environment import LOCAL as env_backend
        require_runnable(list(self.tasks.values()), backend=env_backend,
                         allow_internet=settings.sandbox.allow_internet)
        self.renderer = ChatRenderer.default()
        self.sandbox = make_sandbox(trials_root, run_id, settings.sandbox_fields(),
                                    agent_timeout_override_s=r.timeout_override_s,
                                    allow_lower_timeout=r.allow_lower_timeouts)
        self.bucket = TokenBucket(r.sandbox_rate_per_s, burst=max(1, r.max_concurrency))
        self.harness = None
        if settings.harness is not None:
            from t1ops.campaign.harness import HarnessHost

            emissions = None if run_dir is None else f"{run_dir}/emissions/endpoint-w{index}.jsonl"
            self.harness = HarnessHost(settings.harness, settings.agent, self.renderer, index, emissions)

    def ping(self) -> str:
        return self.node

    def close_trials(self) -> int:
        """Close the trials still open (unmount their tmpfs, drop their cgroups) before the
        actor is killed at shutdown; returns how many there were."""
        return self.sandbox.close_all()

    def pid(self) -> int:
        return os.getpid()

    def progress(self) -> int:
        """Trials this worker has finished (any outcome) since it started: the stall detector's pulse."""
        return self.num_finished

    async def rollout(self, step: int, groups: list[list[TrialSpec]], accept_groups: int | None = None,
                      trace: dict | None = None) -> BatchResult:
        """Run ``groups`` of trials; accept the first ``accept_groups`` to finish (skim).

        Returns the kept :class:`TrialResult` s in plan order with the ledger's books and the skim counts.
        A RoutingError in any trial is re-raised: the rollout aborts (so does any failure with
        ``rollout.failed_trials = "abort"``).
        ``trace`` is the coordinator's span context (``telemetry.trace_carrier``):
        the trials' spans join the step's trace.
        """
        with telemetry.span("rollout", parent=trace, step=step, node=self.node):
            return await self._rollout(step, groups, accept_groups or len(groups))

    async def _rollout(self, step: int, groups, accept_groups: int) -> BatchResult:
        # Trials run in threads; the default pool (min(32, cores + 4)) would cap concurrency below the config.
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(self.settings.rollout.max_concurrency, thread_name_prefix="trial"))
        ledger = TrialLedger(name=f"rollout-step{step}@{self.node}")
        skim = SkimAccounting()
        cancel = threading.Event()
        sem = asyncio.Semaphore(self.settings.rollout.max_concurrency)

        async def one(spec: TrialSpec, idx: int) -> TrialResult:
            queued = time.monotonic()
            async with sem:
                await self.bucket.acquire()
                try:
                    return await asyncio.to_thread(self._trial, spec, idx, cancel, step,
                                                   time.monotonic() - queued)
                finally:
                    self.num_finished += 1

        group_futs = []
        for g, specs in enumerate(groups):
            for spec in specs:
                ledger.expect(f"{spec.group_id}/{spec.sample_idx}")
            group_futs.append(asyncio.ensure_future(
                asyncio.gather(*(one(s, g * 1000 + s.sample_idx) for s in specs), return_exceptions=True)))
        accepted, pending = [], set(group_futs)
        while pending and len(accepted) < accept_groups:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            accepted += sorted(done, key=group_futs.index)
        cancel.set()  # the tail stops at its next turn boundary
        tail = await asyncio.gather(*pending) if pending else []
        results = []  # in plan order (group, then sample), never arrival order: docs/determinism.md
        for fut in sorted(accepted[:accept_groups], key=group_futs.index):
            results += self._book(fut.result(), groups[group_futs.index(fut)], ledger, skim, accepted=True)
        for fut in accepted[accept_groups:]:
            self._book(fut.result(), groups[group_futs.index(fut)], ledger, skim, accepted=False)
        for res, fut in zip(tail, pending):
            self._book(res, groups[group_futs.index(fut)], ledger, skim, accepted=False)
        books = ledger.close()
        skim.check()
        results = await asyncio.to_thread(stage, results, self.store, self.index)  # off the event loop
        return BatchResult(results=results, ledger=books, failed=dict(ledger.failed), node=self.node,
                           skim={"accepted": dict(skim.accepted), "cancelled": dict(skim.cancelled)})

    async def rollout_group(self, group: list[TrialSpec], started_step: int) -> GroupResult:
        """Fully async: one prompt group, returned as soon as it is done (t1ops.campaign.async_worker)."""
        return await run_group(self, group, started_step)

    async def write_dumps(self, dump_dir: str, step: int, items: list[dict]) -> int:
        """Write the dumps of trials this worker staged (``t1ops.campaign.dataplane.write_dumps``)."""
        return await asyncio.to_thread(write_dump_items, dump_dir, step, items)

    async def stop_groups(self) -> None:
        """Fully async, end of run: running group trials stop at their next turn (cancelled)."""
        stop_groups(self)

    def _book(self, outcomes, specs, ledger: TrialLedger, skim: SkimAccounting,
              accepted: bool) -> list[TrialResult]:
        """Settle one group's trials in the ledger; abort on routing errors (never drop). A failed
        trial is dropped, kept as reward 0 with no rows, or aborts (``rollout.failed_trials``)."""
        kept = []
        policy = self.settings.rollout.failed_trials
        for spec, out in zip(specs, outcomes):
            tid = f"{spec.group_id}/{spec.sample_idx}"
            failure = isinstance(out, BaseException) and not isinstance(out, Cancelled)
            if isinstance(out, self.ABORT_ON) or (failure and accepted and policy == "abort"):
                ledger.fail(tid, out)
                raise out
            if isinstance(out, Cancelled) or (not accepted and not isinstance(out, BaseException)):
                ledger.cancel(tid, "skim: tail cancelled")
            elif isinstance(out, BaseException):
                ledger.fail(tid, out)
                if policy == "zero":
                    kept.append(failed_row(spec, self.tasks[spec.task].family, out))
            else:
                ledger.complete(tid)
                kept.append(out)
        skim.record(self.tasks[specs[0].task].family, accepted=accepted)
        return kept if accepted else []

    async def evaluate(self, step: int, trials: list, temperature: float,
                       tasks_dir: str | None = None) -> BatchResult:
        """Held-out eval trials on their own event loop, sharing this worker's token bucket
        (``t1ops.campaign.evaluation``); returns results and the eval ledger's books."""
        if tasks_dir is not None and not hasattr(self, "_eval_tasks"):
            self._eval_tasks = {t.name: t for t in load_pool(tasks_dir)}
        tasks = self._eval_tasks if tasks_dir is not None else self.tasks
        return await run_on_own_loop(self, step, trials, eval_agent(self.settings.agent, temperature), tasks)

    def _trial(self, spec: TrialSpec, idx: int, cancel: threading.Event, step: int = 0,
               queue_s: float = 0.0, *, task=None, agent: AgentSettings | None = None) -> TrialResult:
        """The one trial runner (training batches, async groups, held-out evaluation): sandbox,
        episode, verify, reward, close; returns the trial's :class:`TrialResult`."""
        task = task or self.tasks[spec.task]
        agent = task_agent(agent or self.settings.agent, task)
        sample_id = f"{spec.group_id}-s{spec.sample_idx}"
        clock = TrialClock()
        clock.add("queue_s", queue_s)
        with telemetry.span("trial", step=step, task=task.name, sample_id=sample_id, group_id=spec.group_id,
                            queue_s=round(queue_s, 4)) as trial_span:
            with clock.phase("sandbox_s", "sandbox.create", task=task.name):
                trial = self.sandbox.create(task, idx)
            trial_span.set_attribute("trial_id", trial.trial_id)
            telemetry.event("trial.started", trial=sample_id)  # progress events (chaos schedules fire on them)
            try:
                out = self._run_trial(task, trial, spec, sample_id, cancel, clock, agent, step)
            finally:
                telemetry.event("trial.finished", trial=sample_id)
            trial_span.set_attribute("num_turns", out.num_turns)
            trial_span.set_attribute("end_reason", out.end_reason)
        return out.replace(**clock.row())

    def _run_trial(self, task, trial, spec: TrialSpec, sample_id: str, cancel: threading.Event,
                   clock: TrialClock, agent: AgentSettings, step: int = 0) -> TrialResult:
        calls = itertools.count()  # the trial's generation requests, in the order the agent makes them

        def generate(req):
            if cancel.is_set():
                raise Cancelled(sample_id)
            if self.settings.seed is not None:  # per-request seed (docs/determinism.md)
                req = seeded(req, request_seed(self.settings.seed, step, spec, next(calls)))
            with clock.phase("generate_s", "generate", prompt_tokens=len(req.input_ids),
                             max_new_tokens=req.sampling_params.max_new_tokens) as sp:
                resp = self.engines.generate(req)
                sp.set_attribute("output_tokens", len(resp.output_ids))
                sp.set_attribute("finish_reason", resp.finish_reason.type)
                sp.set_attribute("weight_version", resp.weight_version)
                return resp

        def execute(command):
            with clock.phase("sandbox_s", "sandbox.exec", command=command[:200]) as sp:
                res = trial.exec(command)
                sp.set_attribute("exit_code", -1 if res.exit_code is None else res.exit_code)
                sp.set_attribute("reason", res.reason)
                return res

        try:
            try:
                if self.harness is not None and self.harness.settings.command:
                    ep = self.harness.run(trial, task, generate, sample_id=sample_id, group_id=spec.group_id,
                                          agent=agent)
                    if cancel.is_set():
                        raise Cancelled(sample_id)
                else:
                    tools = self.harness.toolbox(trial) if self.harness is not None else None
                    try:
                        ep = run_episode(task.instruction, execute, generate, self.renderer, agent,
                                         sample_id=sample_id, group_id=spec.group_id, prompt_id=task.name,
                                         tracer=telemetry.tracer(), tools=tools)
                    finally:
                        if tools is not None:
                            tools.close()
            finally:
                with clock.phase("sandbox_s", "sandbox.finish"):
                    trial.finish()
            with clock.phase("verify_s", "verify") as sp:
                verdict = verify_within(trial, scale=self.settings.rollout.reward_scale,
                                        timeout_cap_s=self.settings.field_guards.verifier_timeout_cap_s)
                sp.set_attribute("tamper_events", len(verdict.tamper_events))
            check_verdict(task.name, verdict)  # no verdict, no reward: rollout.failed_trials decides
        finally:
            trial.close()   # the trial's tmpfs and cgroup go; verifier/result.json stays
        with telemetry.span("reward", reward=verdict.reward.value, source=verdict.reward.source,
                            passed=verdict.reward.passed, total=verdict.reward.total):
            for ev in verdict.tamper_events:
                telemetry.event("verifier.tamper", severity="error", trial=ev.trial_id, kind=ev.kind, path=ev.path)
        return TrialResult(
            trial_id=trial.trial_id, task=task.name, family=task.family, group_id=spec.group_id, sample_id=sample_id,
            reward=verdict.reward.value, reward_source=verdict.reward.source,
            reward_fallback=getattr(verdict.reward, "ctrf_fallback", None), solved=is_solved(verdict.reward),
            passed=verdict.reward.passed, total=verdict.reward.total, num_turns=ep.num_turns,
            end_reason=ep.end_reason, commands=getattr(ep, "commands", []), parse_failures=ep.parse_failures,
            harness=getattr(ep, "stats", None), compactions=getattr(ep, "compactions", 0),
            summary_failures=getattr(ep, "summary_failures", 0),
            tamper=[asdict(e) for e in verdict.tamper_events], chunks=ep.chunks)


def task_agent(agent: AgentSettings, task) -> AgentSettings:
    """The agent limits of one task's trials. Precedence (docs/tasks.md): ``rollout.max_turns`` is
    the ceiling; a task's ``[agent] max_turns`` lowers it for its own trials, never raises it."""
    own = getattr(task, "max_turns", None)
    if own is None or own >= agent.max_turns:
        return agent
    return agent.model_copy(update={"max_turns": int(own)})


def plan_groups(task_names: list[str], step: int, batch_size: int, n_samples: int, seed: int,
                overprovision: float = 1.0) -> tuple[list[list[TrialSpec]], int]:
    """Pick tasks for one step: ``batch_size`` trajectories in groups of ``n_samples``
    (plus skim over-provisioning). Returns (groups, groups to accept)."""
    num_groups = max(1, batch_size // n_samples)
    launch = max(num_groups, math.ceil(num_groups * overprovision))
    # Epochs over the pool in a seeded order: every task is seen once before any is seen twice.
    order = sorted(task_names)
    random.Random(seed).shuffle(order)
    start = (step - 1) * launch
    picked = [order[(start + i) % len(order)] for i in range(launch)]
    groups = [[TrialSpec(t, f"st{step}-g{g}-{t}", s) for s in range(n_samples)] for g, t in enumerate(picked)]
    return groups, num_groups
