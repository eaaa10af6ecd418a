"""single-loop-lock: a token-bucket lock bound to the training loop crashes eval-loop trials.

Fault (real): one asyncio.Lock, created once and first contended on the
training loop, is then awaited by 89 eval trials on a second event loop in
another thread. asyncio raises "is bound to a different event loop" for every
eval trial that has to wait; a collector that gathers with
``return_exceptions=True`` and keeps only the results quietly shrinks the eval
(the report: 82/89 eval tasks dropped).

Guard: ``t1ops.guards.pacing.TokenBucket`` keys its lock by running loop, and
``TrialLedger`` accounts expected vs completed, so a dropped trial is named.
"""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from t1ops.errors import StallError
from t1ops.guards.pacing import TokenBucket, TrialLedger

NUM_EVAL = 89  # the report's eval size


class _SingleLoopBucket:
    """The buggy bucket: one asyncio.Lock for the whole process."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            await asyncio.sleep(0.001)


async def _trial(bucket, i: int) -> int:
    await bucket.acquire()
    await asyncio.sleep(0.001)  # the "sandbox" work
    return i


async def _run_batch(bucket, n: int, ledger: TrialLedger | None, prefix: str) -> list:
    ids = [f"{prefix}-{i}" for i in range(n)]
    if ledger:
        for t in ids:
            ledger.expect(t)
    results = await asyncio.gather(*(_trial(bucket, i) for i in range(n)), return_exceptions=True)
    if ledger:
        for t, r in zip(ids, results):
            ledger.fail(t, r) if isinstance(r, BaseException) else ledger.complete(t)
    return results


def _in_thread(coro_fn) -> list:
    out: list = []
    th = threading.Thread(target=lambda: out.append(asyncio.run(coro_fn())))
    th.start()
    th.join(timeout=60)
    return out[0]


def _campaign(bucket, ledger: TrialLedger | None) -> tuple[int, list]:
    """Training loop first (binds a shared lock), then the eval loop in another thread."""
    asyncio.run(_run_batch(bucket, 16, None, "train"))
    results = _in_thread(lambda: _run_batch(bucket, NUM_EVAL, ledger, "eval"))
    kept = [r for r in results if not isinstance(r, BaseException)]  # the naive collector
    return len(kept), [r for r in results if isinstance(r, BaseException)]


@register("single-loop-lock", "a token-bucket lock bound to one event loop silently drops eval trials")
def run(tmp: Path) -> Outcome:
    kept, errors = _campaign(_SingleLoopBucket(), None)
    loop_errors = [e for e in errors if "different event loop" in str(e)]
    fault_fired = len(loop_errors) > 0
    unguarded = f"eval collected {kept}/{NUM_EVAL} results, no error surfaced ({len(loop_errors)} trials crashed with 'bound to a different event loop')"

    # Guarded 1: the same buggy lock with a ledger: the drop is named, not silent.
    ledger = TrialLedger(name="eval")
    t0 = time.monotonic()
    tl = Timeline()  # from the eval on the buggy lock: the ledger names the drop; the loop-keyed lock completes
    tl.fault(at=t0)
    _campaign(_SingleLoopBucket(), ledger)
    named = len(ledger.failed)
    try:
        ledger.close()
    except StallError:
        pass
    detection_s = time.monotonic() - t0
    if named:
        tl.detected()

    # Guarded 2: the loop-keyed bucket: every eval trial completes.
    ledger_ok = TrialLedger(name="eval")
    kept_ok, errors_ok = _campaign(TokenBucket(rate_per_s=5000, burst=1), ledger_ok)
    books = ledger_ok.close()
    if kept_ok == NUM_EVAL:
        tl.healthy()
    caught = kept_ok == NUM_EVAL and not errors_ok and named == len(loop_errors)
    return Outcome(
        fault_fired=fault_fired, unguarded=unguarded,
        guarded=Guarded(caught=caught, detection_s=detection_s,
                        error=f"ledger named {named} failed eval trials ({next(iter(ledger.failed.values()), '')}); "
                              f"with the loop-keyed bucket eval completed {kept_ok}/{NUM_EVAL}"),
        invariants={"unguarded_eval_silently_dropped_trials": kept < NUM_EVAL and len(loop_errors) > 0,
                    "no_trial_vanished": books["missing"] == 0, "all_eval_completed": kept_ok == NUM_EVAL},
        details={"unguarded_kept": kept, "unguarded_crashed": len(loop_errors), "guarded_books": books},
        recovery=tl.recovery(trials_lost=named, how="named by the eval ledger; the production loop-keyed bucket's "
                                                    "eval completed every trial (the runbook's fix)"))
