"""The discrete-event model of a campaign's step loop (simpy; docs/scale.md).

What is modelled, and where it comes from in the code it predicts:

- a trial (``t1ops.campaign.worker``): waits for one of ``max_concurrency`` slots, then a
  token from the sandbox bucket (rate, burst = max_concurrency), creates its sandbox, runs its
  turns (a generate request to the least-loaded engine, then the sandbox command) and its tail
  (finish, verify). A skimmed trial stops at its next turn boundary; so does one past the wall.
- generation time follows the per-engine throughput curve of ``bench/bench_engine.py``: a
  stream's seconds per token at ``n`` concurrent streams is ``n / T(n)``;
- ``sync`` and ``one_step`` (``t1ops.campaign.runner.step_loop``): batch t+1 is submitted when
  batch t is collected and must be done before the weight sync, so a step is
  max(rollout, train) + sync (the report's rule) + the coordinator's own seconds;
  skim launches ``ceil(groups x overprovision)`` groups, accepts the first to finish and waits
  for the cancelled tail to stop;
- ``fully_async`` (``t1ops.campaign.async_loop``): groups start when
  :class:`rl.staleness.StalenessManager` grants a slot (the walkthrough's capacity rule, the
  same class), the trainer takes ``batch / group`` accepted groups per step, the weight sync
  pauses generation in place, and a group's lag is ``step trained - step started``.
"""
from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

import simpy

from rl.staleness import StalenessManager
from t1ops.errors import ConfigError
from t1ops.plan.inputs import SimConfig, TrialSample, Workload, stream_seconds_per_token

TRAIN_SLICE_S = 0.25  # a shared host's load is re-read this often while training


@dataclass
class StepRecord:
    step: int
    step_s: float
    rollout_wait_s: float   # the step waited on generation (the trainer idle)
    train_s: float
    sync_s: float
    overhead_s: float
    rollout_s: float        # the batch's generation time, submission to last trial
    num_trajectories: int
    tokens: int


@dataclass
class Run:
    """One repeat's raw outcome."""

    steps: list[StepRecord] = field(default_factory=list)
    wall_s: float = 0.0
    engine_busy_s: float = 0.0
    train_busy_s: float = 0.0
    trials: int = 0
    trials_cancelled: int = 0
    trial_s: float = 0.0
    trial_s_cancelled: float = 0.0
    lags: Counter = field(default_factory=Counter)      # fully_async: groups trained by lag
    violations: int = 0
    groups_accepted: int = 0


class _Cancel:
    def __init__(self) -> None:
        self.is_set = False


class Model:
    def __init__(self, cfg: SimConfig, workload: Workload, seed: int) -> None:
        self.cfg, self.workload, self.rng = cfg, workload, random.Random(seed)
        self.env = simpy.Environment()
        r = cfg.rollout
        self.slots = simpy.Resource(self.env, capacity=r.max_concurrency)
        self.burst = float(r.bucket_burst or r.max_concurrency)
        self.tokens, self.bucket_t = self.burst, 0.0
        n = cfg.cluster.num_engines
        self.active, self.last, self.busy = [0] * n, [0.0] * n, [0.0] * n
        self.training, self.paused = False, None   # paused: an event while a fully_async sync holds the engines
        self.running = 0                           # trials past their slot and bucket (jobs on a shared host)
        self.run = Run()
        if workload.samples == [] and not cfg.cluster.engine_curve:
            raise ConfigError("hand-given trials need cluster.engine_curve (tokens/s per engine at a concurrency, "
                              "e.g. from bench/bench_engine.py) to turn tokens into seconds", key="cluster.engine_curve")

    # --- the rollout side ---------------------------------------------------------------
    def _bucket_delay(self) -> float:
        """Seconds until this acquirer's token (a FIFO debt model of the worker's TokenBucket)."""
        now, rate = self.env.now, self.cfg.rollout.sandbox_rate_per_s
        self.tokens = min(self.burst, self.tokens + (now - self.bucket_t) * rate)
        self.bucket_t = now
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / rate

    def _slow(self) -> float:
        """How much slower work runs now on a shared host (1 on disjoint devices)."""
        cpus = self.cfg.cluster.shared_host_cpus
        return max(1.0, (self.running + self.training) / cpus) if cpus > 0 else 1.0

    def _engine(self, delta: int, e: int | None = None) -> int:
        if e is None:
            e = min(range(len(self.active)), key=self.active.__getitem__)
        now = self.env.now
        if self.active[e] > 0:
            self.busy[e] += now - self.last[e]
        self.last[e], self.active[e] = now, self.active[e] + delta
        return e

    def _generate_s(self, turn, n: int) -> float:
        curve = self.cfg.cluster.engine_curve
        if turn.generate_s is not None:
            if not curve:
                return turn.generate_s
            return turn.generate_s * stream_seconds_per_token(curve, n) / stream_seconds_per_token(
                curve, self.workload.measured_concurrency)
        prefill = self.cfg.cluster.prefill_tokens_per_s
        return turn.output_tokens * stream_seconds_per_token(curve, n) + (
            turn.new_prompt_tokens / prefill if prefill > 0 else 0.0)

    def trial(self, cancel: _Cancel, task: str | None = None):
        """One trial; returns (completed, tokens)."""
        s: TrialSample = self.workload.draw(self.rng, task)
        wall = self.cfg.rollout.trial_wall_s
        with self.slots.request() as slot:
            yield slot
            delay = self._bucket_delay()
            if delay:
                yield self.env.timeout(delay)
            t0 = self.env.now
            self.running += 1   # a job on a shared host, except while a sandbox command runs (it may sleep)
            yield self.env.timeout(s.create_s * self._slow())
            stopped = False
            for turn in s.turns:
                if cancel.is_set or (wall is not None and self.env.now - t0 > wall):
                    stopped = cancel.is_set
                    break
                if self.paused is not None:
                    yield self.paused
                e = self._engine(+1)
                yield self.env.timeout(self._generate_s(turn, self.active[e]) * self._slow())
                self._engine(-1, e)
                self.running -= 1
                yield self.env.timeout(turn.exec_s)
                self.running += 1
            if not stopped:
                yield self.env.timeout(s.post_s * self._slow())
            self.running -= 1
            self.run.trials += 1
            self.run.trial_s += self.env.now - t0
            if stopped:
                self.run.trials_cancelled += 1
                self.run.trial_s_cancelled += self.env.now - t0
        return (not stopped), s.tokens

    def group(self, cancel: _Cancel, task: str | None = None):
        procs = [self.env.process(self.trial(cancel, task)) for _ in range(self.cfg.rollout.group_size)]
        outcomes = yield self.env.all_of(procs)
        return [outcomes[p] for p in procs]

    def _tasks(self, step: int) -> list[str | None]:
        """The tasks of a step's groups in the campaign's own order (``plan_groups``) when measured."""
        r = self.cfg.rollout
        num_groups = r.batch_size // r.group_size
        launch = max(num_groups, math.ceil(num_groups * r.skim_overprovision))
        if not self.workload.tasks:
            return [None] * launch
        from t1ops.campaign.worker import plan_groups

        groups, _ = plan_groups(self.workload.tasks, step, r.batch_size, r.group_size, self.cfg.seed,
                                r.skim_overprovision)
        return [g[0].task for g in groups]

    def batch(self, step: int):
        """One step's batch (sync/one_step, with skim): returns (trajectories, tokens, seconds)."""
        r, t0 = self.cfg.rollout, self.env.now
        num_groups = r.batch_size // r.group_size
        cancel = _Cancel()
        pending = [self.env.process(self.group(cancel, task)) for task in self._tasks(step)]
        accepted: list = []
        while len(accepted) < num_groups and pending:
            yield self.env.any_of(pending)
            done = [p for p in pending if p.processed or p.triggered]
            pending = [p for p in pending if p not in done]
            accepted += [p.value for p in done]
        cancel.is_set = True  # the tail stops at its next turn boundary
        if pending:
            yield self.env.all_of(pending)
        kept = [o for g in accepted[:num_groups] for o in g if o[0]]
        return len(kept), sum(tok for _, tok in kept), self.env.now - t0

    # --- the trainer side ----------------------------------------------------------------
    def _train(self, tokens: int):
        """Train seconds = fixed + per token; on a shared host in slices, each at the host's load then."""
        t, t0 = self.cfg.train, self.env.now
        work = t.fixed_s + t.s_per_token * tokens
        self.training = True
        while work > 1e-9:
            slow = self._slow()
            wall = work if self.cfg.cluster.shared_host_cpus <= 0 else min(TRAIN_SLICE_S, work * slow)
            yield self.env.timeout(wall)
            work -= wall / slow
        self.training = False
        self.run.train_busy_s += self.env.now - t0

    def pipelined_loop(self):
        """``t1ops.campaign.runner.step_loop`` for sync and one_step."""
        c, t = self.cfg, self.cfg.train
        pipelined = c.pipeline.mode == "one_step"
        pending = self.env.process(self.batch(1))
        for step in range(1, c.pipeline.steps + 1):
            t_step = self.env.now
            if pending is None:
                pending = self.env.process(self.batch(step))
            n, tokens, rollout_s = yield pending
            wait = self.env.now - t_step
            pending = self.env.process(self.batch(step + 1)) if pipelined and step < c.pipeline.steps else None
            t_train = self.env.now
            yield from self._train(tokens)
            train_s = self.env.now - t_train
            if pending is not None:
                t_wait = self.env.now
                yield pending  # no request may span the weight sync
                wait += self.env.now - t_wait
            yield self.env.timeout(t.sync_s + t.overhead_s)
            self.run.steps.append(StepRecord(step, self.env.now - t_step, wait, train_s, t.sync_s, t.overhead_s,
                                             rollout_s, n, tokens))

    def async_loop(self):
        """``t1ops.campaign.async_loop`` with the walkthrough's capacity rule."""
        c, t = self.cfg, self.cfg.train
        gps = c.rollout.batch_size // c.rollout.group_size
        mgr = StalenessManager(max_staleness=c.pipeline.max_staleness, batch_size=gps,
                               max_concurrency=c.pipeline.num_parallel_generation_workers)
        queue: list = []
        self.queue_changed = self.env.event()
        stop = _Cancel()

        planner = None
        if self.workload.tasks:  # the campaign's own endless seeded order over its tasks
            from t1ops.campaign.async_loop import GroupPlanner

            planner = GroupPlanner(self.workload.tasks, c.rollout.group_size, c.seed)

        def group(tag: int, t0: float):
            task = planner.next_group()[0].task if planner is not None else None
            outcomes = yield from self.group(stop, task)
            if stop.is_set:
                return mgr.on_released()
            if any(not ok for ok, _ in outcomes) or self.rng.random() < c.pipeline.zero_variance_share:
                mgr.on_released()   # failed or zero variance: the slot returns, the trainer draws on
            else:
                v = mgr.on_accepted(tag)
                self.run.violations += v is not None
                self.run.groups_accepted += 1
                queue.append((tag, outcomes, self.env.now - t0))
                if not self.queue_changed.triggered:
                    self.queue_changed.succeed()
            fill()

        def fill() -> None:
            while (tag := mgr.try_start()) is not None:
                self.env.process(group(tag, self.env.now))

        fill()
        for step in range(1, c.pipeline.steps + 1):
            t_step = self.env.now
            while len(queue) < gps:
                if self.queue_changed.triggered:
                    self.queue_changed = self.env.event()
                yield self.queue_changed
            taken, queue[:] = queue[:gps], queue[gps:]
            wait = self.env.now - t_step
            for tag, _, _ in taken:
                self.run.lags[step - tag] += 1
            kept = [o for _, g, _ in taken for o in g]
            tokens = sum(tok for _, tok in kept)
            t_train = self.env.now
            yield from self._train(tokens)
            train_s = self.env.now - t_train
            self.paused = self.env.event()   # pause in place: running turns finish, new ones wait
            yield self.env.timeout(t.sync_s)
            self.paused.succeed()
            self.paused = None
            mgr.advance()
            fill()
            yield self.env.timeout(t.overhead_s)
            self.run.steps.append(StepRecord(step, self.env.now - t_step, wait, train_s, t.sync_s, t.overhead_s,
                                             max(d for _, _, d in taken), len(kept), tokens))
        stop.is_set = True

    def go(self) -> Run:
        loop = self.async_loop if self.cfg.pipeline.mode == "fully_async" else self.pipelined_loop
        proc = self.env.process(loop())
        self.env.run(until=proc)
        self.run.wall_s = self.env.now
        for e in range(len(self.active)):
            self._engine(0, e)
        self.run.engine_busy_s = sum(self.busy)
        return self.run


def simulate(cfg: SimConfig, workload: Workload) -> list[Run]:
    """``cfg.repeats`` independent runs (seeds ``cfg.seed``, ``cfg.seed + 1``, ...)."""
    return [Model(cfg, workload, cfg.seed + i).go() for i in range(cfg.repeats)]
