"""Group workers of the fully async pipeline, hosted in the rollout worker (docs/async.md).

The unit of work is one prompt group (all samples of one task), as in the
SkyRL walkthrough (section 8): the coordinator starts a group when the
staleness manager grants a slot, and the group's result comes back on its own,
whatever the other groups do. Trials of all groups on a worker share one
semaphore (``rollout.max_concurrency`` trials at once), one thread pool and the
worker's sandbox token bucket. Every trial is settled in the group's ledger
(completed, failed with its error, or cancelled at the end of the run);
a MissingRoutingError aborts, as in the one-step pipeline.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
from dataclasses import dataclass, field

from t1ops.campaign.dataplane import stage
from t1ops.campaign.trials import GroupResult
from t1ops.guards.pacing import SkimAccounting, TrialLedger


@dataclass
class GroupState:
    """Per-worker state shared by its concurrent group calls (created on first use)."""

    sem: asyncio.Semaphore
    executor: concurrent.futures.ThreadPoolExecutor
    stop: threading.Event = field(default_factory=threading.Event)
    counter: itertools.count = field(default_factory=lambda: itertools.count(100_000))


def group_state(worker) -> GroupState:
    state = getattr(worker, "_group_state", None)
    if state is None:
        n = worker.settings.rollout.max_concurrency
        state = GroupState(asyncio.Semaphore(n),
                           concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="group-trial"))
        worker._group_state = state
    return state


async def run_group(worker, specs: list, started_step: int) -> GroupResult:
    """Run one group's trials concurrently (the worker's one trial runner, ``RolloutWorker._trial``);
    returns its :class:`~t1ops.campaign.trials.GroupResult`: the kept trials and the group's books."""
    state = group_state(worker)
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    ledger = TrialLedger(name=f"group-{specs[0].group_id}@{worker.node}")
    for spec in specs:
        ledger.expect(f"{spec.group_id}/{spec.sample_idx}")

    async def one(spec):
        queued = time.monotonic()
        async with state.sem:
            await worker.bucket.acquire()
            try:  # the trial's span is tagged with the step the group started in, and its queue time
                return await loop.run_in_executor(state.executor, worker._trial, spec, next(state.counter),
                                                  state.stop, started_step, time.monotonic() - queued)
            finally:
                worker.num_finished += 1

    outcomes = await asyncio.gather(*(one(s) for s in specs), return_exceptions=True)
    results = await asyncio.to_thread(stage, worker._book(outcomes, specs, ledger, SkimAccounting(), accepted=True),
                                      getattr(worker, "store", None), getattr(worker, "index", 0))
    return GroupResult(group_id=specs[0].group_id, task=specs[0].task, started_step=started_step,
                       results=results, ledger=ledger.close(), failed=dict(ledger.failed), node=worker.node,
                       duration_s=round(time.monotonic() - t0, 3))


def stop_groups(worker) -> None:
    """End of run: trials still running stop at their next turn (booked as cancelled)."""
    group_state(worker).stop.set()
