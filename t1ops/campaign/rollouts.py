"""Dispatch a step's trial groups to the rollout workers and collect them.

Groups are dealt round-robin to the workers (one per node). Collection goes
through the stall detector, fed per finished trial (workers count them): trials
in flight with none finishing for ``guards.stall_timeout_s`` is a StallError
naming the causes it can check, never an endless "collected 0/N". A MissingRoutingError raised by a worker
aborts the campaign by name (a dropped sample would bias the batch).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import ray

from t1ops import telemetry
from t1ops.campaign.async_buffer import version_lag_histogram
from t1ops.campaign.group_ledger import trained_group_ids
from t1ops.campaign.trials import BatchResult, TrialResult, require_results
from t1ops.campaign.worker import plan_groups
from t1ops.errors import RoutingError

POLL_S = 0.5


@dataclass
class Pending:
    step: int
    refs: list
    num_trials: int
    submitted_at: float = field(default_factory=time.monotonic)
    done_at: float | None = None
    order: dict = field(default_factory=dict)  # group id -> its index in the step's plan


class Rollouts:
    def __init__(self, cfg, workers: list, task_names: list[str], stall) -> None:
        self.cfg, self.workers, self.task_names, self.stall = cfg, workers, task_names, stall
        self.in_flight = 0
        self.pids = ray.get([w.pid.remote() for w in workers])
        self._finished = [0] * len(workers)  # last progress() seen per worker
        self.num_sent = 0  # trials the workers report finished (their results sent), all steps
        stall.set_num_sent(lambda: self.num_sent)

    def check_workers(self) -> list[int]:
        """Indices of workers Ray restarted since the last check (their rollouts were rerun)."""
        pids = ray.get([w.pid.remote() for w in self.workers])
        restarted = [i for i, (a, b) in enumerate(zip(self.pids, pids)) if a != b]
        for i in restarted:
            telemetry.event("campaign.worker_restarted", severity="warn", worker=i, old_pid=self.pids[i],
                            new_pid=pids[i])
        self.pids = pids
        return restarted

    def submit(self, step: int) -> Pending:
        r = self.cfg.rollout
        groups, accept = plan_groups(self.task_names, step, r.batch_size, r.n_samples_per_prompt,
                                     self.cfg.run.seed, r.skim_overprovision)
        shards = [groups[i::len(self.workers)] for i in range(len(self.workers))]
        refs = []
        with telemetry.span("rollout.submit", step=step, num_groups=len(groups)):  # the trials' root span
            carrier = telemetry.trace_carrier()
            for w, shard, share in zip(self.workers, shards, _split(accept, [len(s) for s in shards])):
                if shard:
                    refs.append(w.rollout.remote(step, shard, share, trace=carrier))
        n = sum(len(g) for g in groups)
        self.stall.on_submit(n)
        self.in_flight += n
        telemetry.gauge("rollout.in_flight", self.in_flight)
        return Pending(step, refs, n, order={g[0].group_id: i for i, g in enumerate(groups)})

    def _pulse(self, check: bool = True) -> None:
        """Tell the stall detector about the workers' progress (trials they finished and sent), then
        let it judge the silence. Completions are counted where results arrive (:meth:`collect`,
        the async loop's settle), so a result lost on its way stays in flight and is named."""
        now = ray.get([w.progress.remote() for w in self.workers])
        for i, n in enumerate(now):
            delta = n - self._finished[i] if n >= self._finished[i] else n  # a restarted worker counts anew
            if delta > 0:
                self.num_sent += delta
                self.stall.on_progress()
            self._finished[i] = n
        if check:
            self.stall.check()

    def pulse(self) -> None:
        """Feed finished trials to the stall detector and let it judge (the fully async loop's poll)."""
        self._pulse()

    def wait_done(self, pending: Pending) -> None:
        """Block until the batch is generated (results stay in Ray's object store)."""
        remaining = list(pending.refs)
        while remaining:
            _, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=POLL_S)
            if remaining:
                self._pulse()
        pending.done_at = time.monotonic()

    def collect(self, pending: Pending) -> tuple[list[TrialResult], float, dict]:
        """All results of a step, the seconds since submission, and the merged books."""
        results, books = [], {"expected": 0, "completed": 0, "failed": 0, "cancelled": 0, "missing": 0}
        remaining = list(pending.refs)
        while remaining:
            ready, remaining = ray.wait(remaining, num_returns=1, timeout=POLL_S)
            if not ready:
                self._pulse()
                continue
            try:
                out: BatchResult = ray.get(ready[0])
            except ray.exceptions.RayTaskError as err:
                cause = err.as_instanceof_cause()
                if isinstance(cause, RoutingError):  # any routing error aborts (T1 report, section 05)
                    telemetry.event("rollout.aborted", severity="error", step=pending.step, reason=str(cause))
                    raise cause from None
                raise
            results += require_results(out.results, "Rollouts.collect")
            self.stall.on_complete(min(out.ledger["expected"], self.stall.num_in_flight))
            for k in books:
                books[k] += out.ledger[k]
        self._pulse(check=False)
        self.in_flight -= pending.num_trials
        results.sort(key=lambda r: plan_position(r, pending.order))  # the plan's order, not the arrival's
        return results, (pending.done_at or time.monotonic()) - pending.submitted_at, books


def plan_position(result: TrialResult, order: dict) -> tuple[int, int]:
    """Where a trial's result sits in its step's plan: (group index, sample index). A step's batch is
    assembled in this order whatever worker or engine finished first (docs/determinism.md)."""
    return order.get(result.group_id, len(order)), result.sample_idx


def _split(total: int, sizes: list[int]) -> list[int]:
    """Split ``total`` accepted groups over shards in proportion to their sizes (largest remainder)."""
    n = sum(sizes)
    exact = [total * k / n for k in sizes]
    out = [int(x) for x in exact]
    for i in sorted(range(len(sizes)), key=lambda i: exact[i] - out[i], reverse=True)[: total - sum(out)]:
        out[i] += 1
    return [min(o, k) for o, k in zip(out, sizes)]


@dataclass
class StepBatch:
    """What a batch source hands the step: the results, the seconds it waited, its own books."""

    results: list[TrialResult]
    rollout_s: float
    books: dict = field(default_factory=dict)   # sync/one_step: the trial ledger; fully_async: unused
    groups: list = field(default_factory=list)  # fully_async: the groups trained (async_buffer.Group)


class PipelinedSource:
    """run.mode "sync" (generate step t's batch, then train) or "one_step" (batch t+1 generates
    while step t trains; drained before the weight sync, so no request spans it). The behaviour
    policy is the snapshot published for the batch (``TrainerHost.train(..., "snapshot")``)."""

    behaviour = "snapshot"

    def __init__(self, rollouts: Rollouts, *, pipelined: bool, steps: int) -> None:
        self.rollouts, self.pipelined, self.steps = rollouts, pipelined, steps
        self.pending: Pending | None = None

    @property
    def in_flight(self) -> int:
        return self.rollouts.in_flight

    def start(self, first: int, summary) -> None:
        self.pending = self.rollouts.submit(first)

    def take(self, step: int, progress) -> StepBatch:
        if self.pending is None:  # sequential mode: generate this step's batch now
            self.pending = self.rollouts.submit(step)
        results, rollout_s, books = self.rollouts.collect(self.pending)
        self.rollouts.check_workers()
        self.pending = self.rollouts.submit(step + 1) if self.pipelined and step < self.steps else None
        return StepBatch(results, rollout_s, books=books)

    def while_training(self, train_ref, guards) -> None:
        """Nothing to do: batch t+1 (one_step) is already generating on the workers."""

    def before_sync(self) -> None:
        if self.pending is not None:
            self.rollouts.wait_done(self.pending)  # no request may span the weight sync

    def after_sync(self) -> None:
        """Nothing: the next batch was drained before the sync."""

    def row_fields(self, step: int, batch: StepBatch) -> dict:
        lags = version_lag_histogram(batch.results, step - 1)
        return {"ledger": batch.books, "version_lag_tokens": {str(k): v for k, v in lags.items()},
                "group_ids": trained_group_ids(batch.results)}  # the exactly-once audit across resumes

    def before_row(self, summary) -> None:
        """No run-level books beyond the step rows."""

    def after_step(self) -> None:
        """Nothing: one_step submitted the next batch when it took this one."""

    def stop(self, summary) -> None:
        """Nothing in flight survives the last step's drain."""
