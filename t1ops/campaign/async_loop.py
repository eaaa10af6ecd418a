"""run.mode = "fully_async": the walkthrough's staleness-bounded batch source (docs/async.md).

The step itself is the one every mode takes (``t1ops.campaign.runner.take_step``);
:class:`AsyncSource` is what differs. Generation never waits for the trainer except through the capacity rule.
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

A resumed run (``t1ops run --resume``) runs the groups that were queued or generating
at the resume point's row again, first and under their own ids, then continues the
group order (``t1ops.campaign.group_ledger``); its staleness counters are re-derived
from the rule at the resumed version, and every weight sync checks that the budget
is not inflated (``GroupBuffer.check_budget``).
"""
from __future__ import annotations

import itertools
import random
import time
from typing import TYPE_CHECKING

import ray

from t1ops import telemetry
from t1ops.campaign.async_buffer import GroupBuffer, spans_versions, version_lag_histogram
from t1ops.campaign.group_ledger import async_index, replay_plan
from t1ops.campaign.progress import Progress
from t1ops.campaign.rollouts import StepBatch
from t1ops.campaign.summary import Summary
from t1ops.campaign.trials import TrialSpec
from t1ops.errors import ConfigError, RoutingError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "long-tail-stall": ("run.mode", "fully_async.max_staleness_steps", "fully_async.num_parallel_generation_workers", "fully_async.staleness_alarm_share"),
}

if TYPE_CHECKING:  # the type only: the step loop (t1ops.campaign.runner) imports this module
    from t1ops.campaign.runner import Campaign

POLL_S = 0.2
END_GRACE_S = 60.0  # how long running groups may take to stop at the end of the run


class GroupPlanner:
    """An endless seeded order over the training tasks: every task once per epoch."""

    def __init__(self, task_names: list[str], group_size: int, seed: int, start: int = 0,
                 replay: list[str] | None = None) -> None:
        self.names, self.group_size, self.seed = sorted(task_names), group_size, seed
        self.next_index = start  # a resumed run continues the order after the resume point's row
        self.replay = list(replay or [])  # ... after running again the groups it had pending

    def next_group(self) -> list[TrialSpec]:
        if self.replay:  # a group the crashed run generated but never trained: same id, same task
            gid = self.replay.pop(0)
            return [TrialSpec(async_index(gid)[1], gid, s) for s in range(self.group_size)]
        k = self.next_index
        self.next_index += 1
        epoch = k - k % len(self.names)
        order = list(self.names)
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        task = order[k % len(self.names)]
        return [TrialSpec(task, f"ag{k}-{task}", s) for s in range(self.group_size)]


class AsyncDriver:
    """The coordinator side: submit groups within capacity, collect them, settle them."""

    def __init__(self, c: "Campaign", first_step: int = 1, planner_start: int = 0,
                 replay: list[str] | None = None) -> None:
        cfg, fa, r = c.cfg, c.cfg.fully_async, c.cfg.rollout
        self.c = c
        self.buffer = GroupBuffer(groups_per_step=r.batch_size // r.n_samples_per_prompt,
                                  group_size=r.n_samples_per_prompt, max_staleness=fa.max_staleness_steps,
                                  num_workers=fa.num_parallel_generation_workers,
                                  zero_variance_filter=fa.zero_variance_filter,
                                  sample_full_batch=fa.sample_full_batch, max_draws_factor=fa.max_draws_factor,
                                  first_step=first_step, policy=c.reward_policy)
        self.planner = GroupPlanner(c.rollouts.task_names, r.n_samples_per_prompt, cfg.run.seed, planner_start,
                                    replay)
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
        started, group_id = self.in_flight.pop(ref)
        stall = self.c.guards.stall
        stall.on_complete(min(self._sizes.pop(ref), stall.num_in_flight))  # arrived (or definitively failed)
        try:
            data = ray.get(ref)
        except ray.exceptions.RayTaskError as err:
            cause = err.as_instanceof_cause()
            # any routing error aborts (T1 report, section 05); so does any failed trial under
            # rollout.failed_trials = "abort" (the worker re-raised it)
            if isinstance(cause, RoutingError) or self.c.cfg.rollout.failed_trials == "abort":
                telemetry.event("rollout.aborted", severity="error", group=group_id, reason=str(cause))
                raise cause from None
            text = str(cause)
            telemetry.event("rollout.group_failed", severity="error", group=group_id,  # the cause is at the end
                            error=text if len(text) <= 600 else text[:200] + " ... " + text[-400:])
            data = None
        except ray.exceptions.RayError as err:  # the worker died past its restarts
            telemetry.event("rollout.group_failed", severity="error", group=group_id, error=str(err)[:300])
            data = None
        if data is not None and data.ledger["cancelled"]:
            cancelled = True
        if data is not None and data.failed:  # the reason a group came back short, named
            telemetry.event("rollout.group_trials_failed", severity="warn", group=group_id,
                            failed=len(data.failed), sample=str(next(iter(data.failed.values())))[:300])
        outcome = self.buffer.on_done(data, started, cancelled=cancelled, group_id=group_id)
        telemetry.count("rollout.group_settled", outcome=outcome)

    def stop(self) -> dict:
        """End of run: stop running groups at their next turn, settle them as cancelled."""
        ray.get([w.stop_groups.remote() for w in self.c.workers])
        deadline = time.monotonic() + END_GRACE_S
        while self.in_flight and time.monotonic() < deadline:
            ready, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=POLL_S)
            for ref in ready:
                self._settle(ref, cancelled=True)
        for ref in list(self.in_flight):  # still running after the grace: abandoned, booked as cancelled
            ray.cancel(ref, force=False)
            _, gid = self.in_flight.pop(ref)
            stall = self.c.guards.stall
            stall.on_complete(min(self._sizes.pop(ref), stall.num_in_flight))
            self.buffer.on_done(None, 1, cancelled=True, group_id=gid)
        return end_books(self.buffer, self.planner)



class AsyncSource:
    """The fully async batch source for the one step loop (``t1ops.campaign.runner.take_step``)."""

    behaviour = "rollout"  # trajectories may span versions: the per-token rollout log-probs are the behaviour

    def __init__(self, c: "Campaign") -> None:
        self.c = c
        self.driver: AsyncDriver | None = None

    @property
    def in_flight(self) -> int:
        return len(self.driver.in_flight)

    def start(self, first: int, summary: Summary) -> None:
        """A resumed run first runs again the groups queued or generating at the resume row, then
        continues the group order; it records the books it carries across the crash and the
        capacity it starts with (the rule's value at the resumed version)."""
        kept = resumed_books(summary, first - 1) if first > 1 else None
        start, replay = replay_plan(summary.steps, first - 1) if kept is not None else (0, [])
        self.driver = AsyncDriver(self.c, first, planner_start=start, replay=replay)
        if kept is not None:
            m, fa = self.driver.buffer.manager, self.c.cfg.fully_async
            summary.extra.setdefault("async_resumes", []).append({
                "from_step": first - 1, "books_at_resume_point": kept,
                "run_again": replay,  # generated (queued or generating), never trained by a kept step
                "lost_in_crash": kept["running"] + kept["queued"] - len(replay),
                "headroom": (m.max_staleness + m.current_step) * m.batch_size - (m.accepted + m.running),
                "headroom_rule": (fa.max_staleness_steps + 1) * m.batch_size, "capacity": m.capacity()})
        self.driver.fill()

    def take(self, step: int, progress: Progress) -> StepBatch:
        t0, d = time.monotonic(), self.driver
        while not d.buffer.batch_ready():  # generation never stops; the step waits for its groups
            progress.update(step=step, phase="generate", in_flight=len(d.in_flight))
            d.poll()
        groups = d.buffer.take_batch()
        return StepBatch([r for g in groups for r in g.data.results], time.monotonic() - t0, groups=groups)

    def while_training(self, train_ref, guards) -> None:
        while not self.driver.poll(extra=[train_ref]):  # generation continues while the trainer trains
            if guards.watchdog is not None:
                guards.watchdog.check()

    def before_sync(self) -> None:
        """Nothing to drain: the engines pause requests in place (docs/async.md, the barrier)."""

    def after_sync(self) -> None:
        self.driver.buffer.advance()  # the staleness manager opens the next step's slots
        self.driver.buffer.check_budget()  # never more headroom than the rule gives (a recovery's counters)

    def row_fields(self, step: int, batch: StepBatch) -> dict:
        out = step_accounting(self.driver.buffer, batch.groups, batch.results, step,
                          self.c.cfg.fully_async.staleness_alarm_share)
        d = self.driver
        out["async_books"] = row_books(d.buffer, d.planner, [gid for _, gid in d.in_flight.values()])
        return out

    def before_row(self, summary: Summary) -> None:
        summary.extra["async_books"] = self.driver.buffer.books()

    def after_step(self) -> None:
        self.driver.fill()

    def stop(self, summary: Summary) -> None:
        if self.driver is None:
            return
        books = self.driver.stop()
        summary.extra["async_books"] = books
        summary.save()
        if not books["balanced"]:
            telemetry.event("rollout.books_unbalanced", severity="error", **books)


def step_accounting(buffer: GroupBuffer, groups, results: list, step: int, alarm_share: float) -> dict:
    """The step row's async fields: group books, token lag histogram, violations, long trials."""
    out = buffer.close_step()
    trainer_version = step - 1  # the weights the trainer held when step ``step`` began
    out["version_lag_tokens"] = {str(k): v for k, v in version_lag_histogram(results, trainer_version).items()}
    out["trajectories_spanning_versions"] = sum(len(spans_versions(r)) > 1 for r in results)
    out["group_lags"] = {g.group_id: step - g.started_step for g in groups}
    out["ledger"] = trial_ledger(groups)  # health.aborts reads it, as the sync modes' row
    out["staleness_alarm"] = out["violation_share"] > alarm_share
    if out["staleness_alarm"]:
        telemetry.event("rollout.staleness_alarm", severity="error", step=step, share=out["violation_share"],
                        lags=str(out["violation_lags"]), alarm_share=alarm_share)
    for g in groups:
        if g.violation is not None:
            telemetry.event("rollout.staleness_violation", severity="warn", step=step, group=g.group_id,
                            staleness=g.violation.staleness, max_staleness=g.violation.max_staleness)
    return out


def trial_ledger(groups) -> dict:
    """The trial books of the groups a step trains, summed (the sync modes' ``ledger`` field)."""
    keys = ("expected", "completed", "failed", "cancelled", "missing")
    return {k: sum(g.data.ledger.get(k, 0) for g in groups) for k in keys}


def row_books(buffer: GroupBuffer, planner: GroupPlanner, in_flight: list[str]) -> dict:
    """A step row's ``async_books``: the run's group totals, where the group order stands, and the
    groups a resume at this row runs again (queued, generating, or still to be run again)."""
    return {**buffer.books(), "planner_next": planner.next_index,
            "pending": buffer.pending_ids(in_flight) + list(planner.replay)}


def end_books(buffer: GroupBuffer, planner: GroupPlanner) -> dict:
    """The run's group books once every running group is settled, with the leftovers by id: queued
    (never trained), dropped since the last row (cancelled at the stop included) and groups a
    resume was still to run again (``t1ops.campaign.group_ledger.audit_groups`` reads them)."""
    left = buffer.queued_ids() + buffer.book.dropped_ids + list(planner.replay)
    return {**buffer.books(), "left_ids": left, "planner_next": planner.next_index}


def resumed_books(summary: Summary, step: int) -> dict:
    """The run's group books as of the row of ``step`` (the resume point)."""
    rows = [r for r in summary.steps if r["step"] == step and "async_books" in r]
    if not rows:
        raise ConfigError(f"resuming a fully_async run at step {step}: its summary row has no async_books "
                          "(written by an older t1ops), so the group order cannot continue without reusing "
                          "group ids; start a new run", key="run.mode")
    return dict(rows[-1]["async_books"])
