"""run.mode = "fully_async": the walkthrough's staleness-bounded pipeline (docs/async.md).

Generation never waits for the trainer except through the capacity rule.
The coordinator keeps ``fully_async.num_parallel_generation_workers`` prompt
groups generating (one Ray call per group, ``RolloutWorker.rollout_group``),
settles each finished group in :class:`~t1ops.campaign.async_buffer.GroupBuffer`
and, per step:

1. waits until the queue holds ``rollout.batch_size / n_samples_per_prompt``
   useful groups (generation keeps going);
2. trains on them with the per-token rollout log-probs as the behaviour policy
   (``TrainerHost.train(..., behaviour="rollout")``), generation still going;
3. publishes and syncs the weights: the engines pause *in place* (requests
   resume under the new weights; every token keeps its version), the version
   increments, generation resumes; then the staleness manager opens the next
   step's slots.

At the end, running groups are stopped at their next turn and booked as
cancelled; ``summary.json`` gets the run's group books (every submitted group
settled exactly once).
"""
from __future__ import annotations

import itertools
import random
import time

from t1ops import telemetry
from t1ops.campaign.async_buffer import GroupBuffer, version_lag_histogram, spans_versions
from t1ops.campaign.dataplane import write_dumps
from t1ops.campaign.runner import Campaign, _metrics_row
from t1ops.campaign.progress import Progress
from t1ops.campaign.summary import Summary
from t1ops.campaign.trialtrace import step_split
from t1ops.campaign.worker import TrialSpec
from t1ops.errors import MissingRoutingError

POLL_S = 0.2
END_GRACE_S = 60.0  # how long running groups may take to stop at the end of the run


class GroupPlanner:
    """An endless seeded order over the training tasks: every task once per epoch."""

    def __init__(self, task_names: list[str], group_size: int, seed: int) -> None:
        self.names, self.group_size, self.seed = sorted(task_names), group_size, seed
        self.count = itertools.count()
        self._order: list[str] = []

    def next_group(self) -> list[TrialSpec]:
        k = next(self.count)
        if k % len(self.names) == 0:
            self._order = list(self.names)
            random.Random(self.seed * 1_000_003 + k).shuffle(self._order)
        task = self._order[k % len(self.names)]
        return [TrialSpec(task, f"ag{k}-{task}", s) for s in range(self.group_size)]


class AsyncDriver:
    """The coordinator side: submit groups within capacity, collect them, settle them."""

    def __init__(self, c: Campaign, first_step: int = 1) -> None:
        cfg, fa, r = c.cfg, c.cfg.fully_async, c.cfg.rollout
        self.c = c
        self.buffer = GroupBuffer(groups_per_step=r.batch_size // r.n_samples_per_prompt,
                                  group_size=r.n_samples_per_prompt, max_staleness=fa.max_staleness_steps,
                                  num_workers=fa.num_parallel_generation_workers,
                                  zero_variance_filter=fa.zero_variance_filter,
                                  sample_full_batch=fa.sample_full_batch, max_draws_factor=fa.max_draws_factor,
                                  first_step=first_step)
        self.planner = GroupPlanner(c.rollouts.task_names, r.n_samples_per_prompt, cfg.run.seed)
        self.in_flight: dict = {}  # ray ref -> (started_step, group_id)
        self._sizes: dict = {}  # ray ref -> trials in the group (stall accounting at arrival)
        self._next_worker = itertools.count()

    def fill(self) -> None:
        """Start groups while the staleness manager grants slots."""
        while (tag := self.buffer.try_start()) is not None:
            specs = self.planner.next_group()
            worker = self.c.workers[next(self._next_worker) % len(self.c.workers)]
            ref = worker.rollout_group.remote(specs, tag)
            self.in_flight[ref], self._sizes[ref] = (tag, specs[0].group_id), len(specs)
            self.c.guards.stall.on_submit(len(specs))
        telemetry.gauge("rollout.groups_in_flight", len(self.in_flight))

    def poll(self, extra: list | None = None) -> bool:
        """Wait up to POLL_S for a group (or one of ``extra``); settle finished groups.
        Returns True when one of ``extra`` is ready."""
        import ray

        refs = list(self.in_flight) + list(extra or [])
        if not refs:
            return False
        ready, _ = ray.wait(refs, num_returns=1, timeout=POLL_S)
        ready = set(ready) | set(ray.wait(list(self.in_flight), num_returns=len(self.in_flight), timeout=0)[0]
                                 if self.in_flight else [])
        for ref in [r for r in ready if r in self.in_flight]:
            self._settle(ref)
        self.c.rollouts.pulse()
        self.fill()
        return any(r in ready for r in (extra or []))

    def _settle(self, ref, cancelled: bool = False) -> None:
        import ray

        started, group_id = self.in_flight.pop(ref)
        stall = self.c.guards.stall
        stall.on_complete(min(self._sizes.pop(ref), stall.num_in_flight))  # arrived (or definitively failed)
        try:
            data = ray.get(ref)
        except ray.exceptions.RayTaskError as err:
            cause = err.as_instanceof_cause()
            if isinstance(cause, MissingRoutingError):
                telemetry.event("rollout.aborted", severity="error", group=group_id, reason=str(cause))
                raise cause from None
            telemetry.event("rollout.group_failed", severity="error", group=group_id, error=str(cause)[:300])
            data = None
        except ray.exceptions.RayError as err:  # the worker died past its restarts
            telemetry.event("rollout.group_failed", severity="error", group=group_id, error=str(err)[:300])
            data = None
        if data is not None and data["ledger"]["cancelled"]:
            cancelled = True
        outcome = self.buffer.on_done(data, started, cancelled=cancelled)
        telemetry.count("rollout.group_settled", outcome=outcome)

    def stop(self) -> dict:
        """End of run: stop running groups at their next turn, settle them as cancelled."""
        import ray

        ray.get([w.stop_groups.remote() for w in self.c.workers])
        deadline = time.monotonic() + END_GRACE_S
        while self.in_flight and time.monotonic() < deadline:
            ready, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=POLL_S)
            for ref in ready:
                self._settle(ref, cancelled=True)
        for ref in list(self.in_flight):  # still running after the grace: abandoned, booked as cancelled
            ray.cancel(ref, force=False)
            self.in_flight.pop(ref)
            stall = self.c.guards.stall
            stall.on_complete(min(self._sizes.pop(ref), stall.num_in_flight))
            self.buffer.on_done(None, 1, cancelled=True)
        return self.buffer.books()


def async_step_loop(c: Campaign, summary: Summary, progress: Progress) -> None:
    """Run ``cfg.run.steps`` steps in fully async mode (module docstring)."""
    first = (c.resume_from or 0) + 1
    d, ev = AsyncDriver(c, first), c.evaluator
    if ev is not None and not any(e["step"] == first - 1 for e in summary.evals):
        ev.maybe_submit(first - 1)
    d.fill()
    try:
        for step in range(first, c.cfg.run.steps + 1):
            _one_step(c, d, summary, progress, step)
    finally:
        books = d.stop()
        summary.extra["async_books"] = books
        summary.save()
        if not books["balanced"]:
            telemetry.event("rollout.books_unbalanced", severity="error", **books)
    if ev is not None and ev.collect() is not None:
        progress.log(progress.eval_text(ev.latest))


def _one_step(c: Campaign, d: AsyncDriver, summary: Summary, progress: Progress, step: int) -> None:
    import ray

    t_step, ev = time.monotonic(), c.evaluator
    for hook in c.on_step:  # e.g. a chaos fault schedule
        hook(c, step)
    while not d.buffer.batch_ready():  # generation never stops; the step waits for its groups
        progress.update(step=step, phase="generate", in_flight=len(d.in_flight))
        d.poll()
    groups = d.buffer.take_batch()
    rollout_s = time.monotonic() - t_step
    results = [r for g in groups for r in g.data["results"]]
    progress.update(step=step, phase="train", in_flight=len(d.in_flight))
    t_train = time.monotonic()
    c.guards.train_submitted(step)
    telemetry.event("campaign.train_submitted", step=step)  # progress events: chaos fires faults on them
    train_ref = c.trainer.train.remote(results, "rollout")
    while not d.poll(extra=[train_ref]):  # generation continues while the trainer trains
        if c.guards.watchdog is not None:
            c.guards.watchdog.check()
    stats = c.guards.wait_train(train_ref, step)
    train_s = time.monotonic() - t_train
    telemetry.event("campaign.train_done", step=step)
    if ev is not None:
        ev.collect()  # an eval request must not span the sync: each eval sees the weights it evaluates
    t_sync = time.monotonic()
    ckpt = ray.get(c.trainer.publish.remote(step))
    telemetry.event("campaign.sync_barrier", step=step)
    sync = ray.get(c.router.sync_weights.remote(ckpt, str(step)))  # pause in place, publish, resume
    d.buffer.advance()
    sync_s = time.monotonic() - t_sync
    telemetry.event("campaign.sync_done", step=step)
    if ev is not None:
        ev.maybe_submit(step)
    write_dumps(c.workers, c.run, step, results)  # by the workers that hold the trajectories
    row = _metrics_row(step, results, stats, rollout_s, train_s, time.monotonic() - t_step, sync_s)
    row.update(ray.get(c.trainer.checkpoint_report.remote()))
    row.update(mode="fully_async", engines_recreated=sync["recreated"], engines_dead=sync["dead"],
               **_accounting(d.buffer, groups, results, step, c.cfg.fully_async.staleness_alarm_share),
               **step_split(results, rollout_s))
    c.guards.after_step(step)
    row["guards_s"] = round(c.guards.take_busy_s(), 4)
    if stats.get("ranks"):
        row["ranks"] = stats["ranks"]
    summary.extra["async_books"] = d.buffer.books()
    summary.add_step(row)
    d.fill()
    progress.update(step=step, phase="done", row=row, engines=ray.get(c.router.describe.remote()),
                    evaluation=ev.latest if ev is not None else None)


def _accounting(buffer: GroupBuffer, groups, results: list[dict], step: int, alarm_share: float) -> dict:
    """The step row's async fields: group books, token lag histogram, violations, long trials."""
    out = buffer.close_step()
    trainer_version = step - 1  # the weights the trainer held when step ``step`` began
    out["version_lag_tokens"] = {str(k): v for k, v in version_lag_histogram(results, trainer_version).items()}
    out["trajectories_spanning_versions"] = sum(len(spans_versions(r)) > 1 for r in results)
    out["group_lags"] = {g.group_id: step - buffer.step_offset - g.started_step for g in groups}
    out["staleness_alarm"] = out["violation_share"] > alarm_share
    if out["staleness_alarm"]:
        telemetry.event("rollout.staleness_alarm", severity="error", step=step, share=out["violation_share"],
                        lags=str(out["violation_lags"]), alarm_share=alarm_share)
    for g in groups:
        if g.violation is not None:
            telemetry.event("rollout.staleness_violation", severity="warn", step=step, group=g.group_id,
                            staleness=g.violation.staleness, max_staleness=g.violation.max_staleness)
    return out
