"""queued-groups-age: staleness enforced only when a group starts; finished groups age in the queue.

prime-rl issue #3313 (github.com/PrimeIntellect-ai/prime-rl/issues/3313): the off-policy bound was
checked only while generating; finished groups waiting in the queue for a slow trainer aged without
bound and were trained far beyond ``max_off_policy_steps``; at the end of the run the loop livelocked,
and cancelled requests were counted as errors.

Fault (real): the trainer slows down: while each step trains, generation polls 12 times instead of
once (a slow optimizer step, a long checkpoint), so finished groups pile up behind it.

- Unguarded (the bound checked at start only, as prime-rl had it): a group may start whenever the
  policy it starts on is current, finished groups wait in an unbounded queue; groups are trained
  several steps older than ``max_staleness`` (their lag read at training time), no error.
- Guarded: the production ``GroupBuffer`` (``t1ops/campaign/async_buffer.py``): a group starts only
  with a slot of the capacity rule ``(max_staleness + step) x B - (accepted + running)``, which counts
  queued groups, so generation stops while the queue is full and no group is trained older than
  ``max_staleness``; the queue never exceeds ``(max_staleness + 1) x B``; the groups in flight at the
  end are booked as cancelled, not failed (t1ops is immune by design).
"""
from __future__ import annotations

import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.scenarios.resume_drops_buffered import GROUPS, MAX_STALENESS, AsyncGen, _group, new_async

STEPS = 6
SLOW_POLLS = 12   # generation polls while one slow step trains (1 when the trainer keeps up)
SLOW_FROM = 3     # steps >= this one are slow


def _guarded_run() -> dict:
    gen: AsyncGen = new_async()
    buffer = gen.buffer
    lags, max_queue, t_fault = [], 0, None
    gen.fill()
    for step in range(1, STEPS + 1):
        while not buffer.batch_ready():
            gen.poll()
        groups = buffer.take_batch()
        lags += [step - g.started_step for g in groups]
        if step >= SLOW_FROM and t_fault is None:
            t_fault = time.monotonic()
        for _ in range(SLOW_POLLS if step >= SLOW_FROM else 1):
            gen.poll()
            max_queue = max(max_queue, buffer.queue.qsize())
        buffer.advance()
        buffer.check_budget()
        gen.fill()
    books = gen.stop()
    return {"lags": lags, "max_queue": max_queue, "queue_bound": buffer.queue_size, "totals": dict(buffer.totals),
            "books": books, "t_fault": t_fault, "violations": buffer.totals["violations"]}


def _start_only_run() -> dict:
    """The bound checked when a group starts only: groups start on the current policy (always within the
    bound then) as fast as workers free up, and wait in an unbounded queue."""
    queue, lags, in_flight, k = [], [], [], 0
    workers = 4
    for step in range(1, STEPS + 1):
        def poll():
            nonlocal k
            if in_flight:
                queue.append(in_flight.pop(0))
            while len(in_flight) < workers:
                in_flight.append(_group(f"g{k}", "task-0", step)); k += 1
        while len(queue) < GROUPS:
            poll()
        taken, queue[:] = queue[:GROUPS], queue[GROUPS:]
        lags += [step - g.started_step for g in taken]
        for _ in range(SLOW_POLLS if step >= SLOW_FROM else 1):
            poll()
    return {"lags": lags, "queued_at_end": len(queue)}


@register("queued-groups-age", "staleness enforced only at start: finished groups age in the queue of a slow trainer")
def run(tmp: Path) -> Outcome:
    bad = _start_only_run()
    t0 = time.monotonic()
    good = _guarded_run()
    tl = Timeline()
    tl.fault(good["t_fault"])
    tl.detected(good["t_fault"])   # the capacity rule holds generation back from the first slow step on
    tl.healthy()
    stale = [lag for lag in bad["lags"] if lag > MAX_STALENESS]
    return Outcome(
        fault_fired=True,
        unguarded=(f"bound checked at start only, trainer slow from step {SLOW_FROM}: groups trained up to "
                   f"{max(bad['lags'])} steps old (max_staleness {MAX_STALENESS}); {len(stale)} of "
                   f"{len(bad['lags'])} beyond the bound, {bad['queued_at_end']} groups still queued, no error"),
        guarded=Guarded(caught=max(good["lags"]) <= MAX_STALENESS, detection_s=time.monotonic() - t0,
                        error=f"capacity rule: queue at most {good['max_queue']} of {good['queue_bound']} groups, "
                              f"lags at training {sorted(set(good['lags']))}"),
        invariants={
            "unguarded_groups_trained_beyond_max_staleness": bool(stale) and max(bad["lags"]) > MAX_STALENESS + 1,
            "guarded_no_group_trained_beyond_max_staleness": max(good["lags"]) <= MAX_STALENESS
            and good["violations"] == 0,
            "guarded_queue_within_its_bound": good["max_queue"] <= good["queue_bound"],
            "end_of_run_cancellations_are_not_failures": good["totals"].get("failed", 0) == 0
            and good["totals"].get("cancelled", 0) > 0,
        },
        details={"unguarded_lags": bad["lags"], "guarded_lags": good["lags"], "guarded_totals": good["totals"],
                 "max_queue": good["max_queue"]},
        recovery=tl.recovery(how="in place: generation waits for a slot; no step or trial lost"))
