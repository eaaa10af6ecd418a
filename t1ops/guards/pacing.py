"""Pacing and accounting for trials: the single-loop-lock and skim-tail-bias guards.

The report (section 09): "a single-event-loop lock silently dropped 82/89 eval
tasks. The sandbox-creation token bucket held one asyncio lock bound to the
training loop; every eval-loop trial crashed with 'bound to a different event
loop' and the eval quietly shrank. Locks are now keyed by running loop."

- :class:`TokenBucket` paces sandbox creation (the report: 6/s against the
  provider's quota) with its asyncio state keyed by the running loop, so a
  training loop and an eval loop in other threads can share one bucket.
- :class:`TrialLedger` does expected-vs-completed accounting: every trial that
  was expected ends as completed, failed (with its error) or cancelled (with a
  reason); :meth:`TrialLedger.close` raises if any disappeared.
- :class:`SkimAccounting` counts launched/accepted/cancelled per task family
  for skim over-sampling (launch more than the batch, accept the first to
  finish, cancel the tail) and raises an alarm when the cancelled tail
  concentrates in some families (the report's "most important open trade-off").
"""
from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from t1ops import telemetry
from t1ops.errors import InputError, StallError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "single-loop-lock": ("rollout.sandbox_rate_per_s", "eval.every_steps", "eval.timeout_s"),
    "skim-tail-bias": ("rollout.skim_overprovision",),
}


class TokenBucket:
    """An async token bucket whose lock and sleeps belong to the loop that awaits.

    Tokens are shared across loops (one quota, guarded by a thread lock); the
    asyncio.Lock that serialises waiters is created per running loop, never
    shared, so no waiter ever touches a primitive bound to another loop.
    """

    def __init__(self, rate_per_s: float, burst: int = 1, clock: Callable[[], float] = time.monotonic):
        if rate_per_s <= 0 or burst < 1:
            raise InputError(f"TokenBucket needs rate_per_s > 0 and burst >= 1, got {rate_per_s}, {burst}")
        self.rate_per_s, self.burst, self._clock = rate_per_s, burst, clock
        self._tokens = float(burst)
        self._stamp = clock()
        self._quota = threading.Lock()
        self._loop_locks: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]" = weakref.WeakKeyDictionary()

    def _lock_for_running_loop(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        with self._quota:
            lock = self._loop_locks.get(loop)
            if lock is None:
                lock = self._loop_locks[loop] = asyncio.Lock()
            return lock

    def _take(self) -> float:
        """Take a token if one is there; else return seconds until one will be."""
        with self._quota:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate_per_s)
            self._stamp = now
            if self._tokens >= 1:
                self._tokens -= 1
                return 0.0
            return (1 - self._tokens) / self.rate_per_s

    async def acquire(self) -> None:
        async with self._lock_for_running_loop():
            while (wait_s := self._take()) > 0:
                await asyncio.sleep(wait_s)


@dataclass
class TrialLedger:
    """Expected-vs-completed accounting: no trial disappears silently."""

    name: str = "rollout"
    expected: set[str] = field(default_factory=set)
    completed: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    cancelled: dict[str, str] = field(default_factory=dict)

    def expect(self, trial_id: str) -> None:
        if trial_id in self.expected:
            raise InputError(f"trial {trial_id} expected twice in ledger {self.name}")
        self.expected.add(trial_id)

    def complete(self, trial_id: str) -> None:
        self._settle(trial_id)
        self.completed.add(trial_id)

    def fail(self, trial_id: str, error: BaseException | str) -> None:
        self._settle(trial_id)
        self.failed[trial_id] = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
        telemetry.event("trial.failed", severity="warn", ledger=self.name, trial=trial_id, error=self.failed[trial_id])

    def cancel(self, trial_id: str, reason: str) -> None:
        self._settle(trial_id)
        self.cancelled[trial_id] = reason

    def _settle(self, trial_id: str) -> None:
        if trial_id not in self.expected:
            raise InputError(f"trial {trial_id} settled but never expected in ledger {self.name}")
        if trial_id in self.completed or trial_id in self.failed or trial_id in self.cancelled:
            raise InputError(f"trial {trial_id} settled twice in ledger {self.name}")

    @property
    def missing(self) -> set[str]:
        return self.expected - self.completed - set(self.failed) - set(self.cancelled)

    def summary(self) -> dict:
        return {"expected": len(self.expected), "completed": len(self.completed),
                "failed": len(self.failed), "cancelled": len(self.cancelled), "missing": len(self.missing)}

    def close(self) -> dict:
        """Check the books; raise if any trial vanished. Failures are reported, not hidden."""
        s = self.summary()
        for k, v in s.items():
            telemetry.gauge(f"ledger.{k}", v, ledger=self.name)
        if self.missing:
            raise StallError(f"{self.name}: {len(self.missing)}/{len(self.expected)} trials vanished without a "
                             f"result, error or cancel reason (e.g. {sorted(self.missing)[:3]}); a trial "
                             f"dropped silently biases the batch: check worker logs for these ids",
                             **s)
        if self.failed:
            sample = next(iter(self.failed.values()))
            telemetry.event("ledger.failures", severity="warn", ledger=self.name, **s, sample=sample)
        return s


@dataclass
class SkimAccounting:
    """Per-family launched/accepted/cancelled counts with a tail-bias alarm.

    The alarm fires for a family whose cancel share exceeds the overall cancel
    share by ``bias_ratio`` (and has at least ``min_launched`` trials): the
    skimmed tail is then not random but concentrated on that family.
    """

    bias_ratio: float = 2.0
    min_launched: int = 4
    launched: Counter = field(default_factory=Counter)
    accepted: Counter = field(default_factory=Counter)
    cancelled: Counter = field(default_factory=Counter)

    def record(self, family: str, accepted: bool) -> None:
        self.launched[family] += 1
        (self.accepted if accepted else self.cancelled)[family] += 1

    def biased_families(self) -> dict[str, float]:
        total = sum(self.launched.values())
        overall = sum(self.cancelled.values()) / total if total else 0.0
        out = {}
        for fam, n in self.launched.items():
            share = self.cancelled[fam] / n
            if n >= self.min_launched and overall > 0 and share >= self.bias_ratio * overall and share > 0.5:
                out[fam] = share
        return out

    def check(self) -> dict[str, float]:
        """Emit per-family acceptance and raise the alarm event; return biased families."""
        for fam, n in self.launched.items():
            telemetry.gauge("skim.acceptance", self.accepted[fam] / n, family=fam)
        biased = self.biased_families()
        if biased:
            total = sum(self.launched.values())
            overall = sum(self.cancelled.values()) / total
            telemetry.event("skim.tail_bias", severity="warn", overall_cancel_share=round(overall, 3),
                            families=", ".join(f"{f}={s:.0%}" for f, s in sorted(biased.items())))
        return biased
