"""The capacity rule for fully async generation (SkyRL walkthrough, section 8.1).

Units are prompt groups (one group = all samples of one prompt), not single
trajectories. The rule bounds how far generation may run ahead of training::

    consumer_capacity = (max_staleness + current_step) * batch_size
    capacity = min(max_concurrency - running, consumer_capacity - (accepted + running))

``accepted`` counts groups accepted into the buffer since the start (filtered or
failed groups are released without being accepted); ``current_step`` is the
1-based step the trainer is working towards, so at the start the headroom is
``batch_size * (max_staleness + 1)``: 16 x (3 + 1) = 64 groups in the 397B script.

The rule limits the steady state; it is not a per-trajectory SLA. A long-tail
group can still finish older than ``max_staleness`` steps: it is accepted and the
violation is recorded (walkthrough: "accepts it, records a violation and alerts"),
never silently dropped.

The bounds are checked after every change (:meth:`StalenessManager.check_bounds`),
in production too: a broken bound raises :class:`CapacityError` instead of
letting generation run further ahead than the budget allows.

After a recovery the counters are re-derived from the rule, never restored
(:meth:`StalenessManager.resumed`): a run resumed at version ``V`` has trained
``V`` batches, so ``current_step = V + 1`` and ``accepted = V * batch_size``
(nothing runs in a fresh process; groups that were in flight start again through
:meth:`try_start`). Restoring the version but not ``accepted`` inflates the
headroom by ``V * batch_size`` groups and lets generation run further ahead than
``max_staleness`` allows (AReaL #1345); :meth:`check_budget` names that.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from rl.errors import InputError, T1OpsError


class CapacityError(T1OpsError, RuntimeError):
    """The staleness manager's bounds were broken (an accounting bug, never load)."""


@dataclass(frozen=True)
class StalenessViolation:
    """A group accepted ``staleness`` steps after it started (> ``max_staleness``)."""

    started_step: int
    accepted_step: int
    staleness: int
    max_staleness: int


def _positive_int(name: str, value: Any, minimum: int) -> int:
    if type(value) is not int or value < minimum:
        raise InputError(f"{name} must be an int >= {minimum}, got {value!r}", argument=name)
    return value


@dataclass
class StalenessManager:
    """Counts running and accepted groups and hands out submission slots.

    Call :meth:`try_start` before generating a group (it returns the step to tag
    the group with, or None when there is no capacity), then exactly one of
    :meth:`on_accepted` or :meth:`on_released` when it finishes, and
    :meth:`advance` after each optimizer step's weight sync. ``lock`` guards the
    counters when several threads call in; pass your own to share one.
    """

    max_staleness: int
    batch_size: int
    max_concurrency: int
    current_step: int = 1
    lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)
    accepted: int = field(default=0, init=False)
    running: int = field(default=0, init=False)
    released: int = field(default=0, init=False)
    violations: list[StalenessViolation] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        _positive_int("max_staleness", self.max_staleness, 0)
        _positive_int("batch_size", self.batch_size, 1)
        _positive_int("max_concurrency", self.max_concurrency, 1)
        _positive_int("current_step", self.current_step, 1)

    @classmethod
    def resumed(cls, *, max_staleness: int, batch_size: int, max_concurrency: int, version: int,
                lock: Any = None) -> "StalenessManager":
        """The manager of a run resumed at policy ``version`` (``version`` steps trained): the counters
        are re-derived from the rule, so the headroom is the first step's, ``(max_staleness + 1) x
        batch_size``, whatever the crashed run's counters were."""
        _positive_int("version", version + 1, 1)
        kw = {} if lock is None else {"lock": lock}
        m = cls(max_staleness=max_staleness, batch_size=batch_size, max_concurrency=max_concurrency,
                current_step=version + 1, **kw)
        m.accepted = version * batch_size  # the groups the trained steps consumed
        m.check_budget()
        return m

    def budget_excess(self) -> int:
        """Groups by which the budget exceeds the rule's (> 0: inflated). The trainer takes
        ``batch_size`` accepted groups per step, so once step ``current_step - 1`` has advanced,
        ``accepted >= (current_step - 1) x batch_size``; less means the rule grants that many extra
        groups (a version counter restored without ``accepted``)."""
        with self.lock:
            return (self.current_step - 1) * self.batch_size - self.accepted

    def headroom(self) -> int:
        """The consumer side of the rule, ``(max_staleness + current_step) x batch_size - (accepted +
        running)``: at most ``(max_staleness + 1) x batch_size`` in a consistent manager."""
        with self.lock:
            return (self.max_staleness + self.current_step) * self.batch_size - (self.accepted + self.running)

    def check_budget(self) -> None:
        """Raise CapacityError when the budget exceeds the rule's (an inflated staleness budget,
        e.g. counters restored inconsistently after a recovery); call it after :meth:`advance`."""
        excess = self.budget_excess()
        if excess > 0:
            raise CapacityError(
                f"staleness budget inflated by {excess} groups: at step {self.current_step} accepted is "
                f"{self.accepted} but the {self.current_step - 1} trained steps consumed "
                f"{(self.current_step - 1) * self.batch_size} ({self.batch_size} groups each), so generation may run "
                f"{-(-excess // self.batch_size)} step(s) further ahead than max_staleness {self.max_staleness}. The "
                "counters were restored inconsistently (the version but not accepted); a resumed run must build "
                "its manager with StalenessManager.resumed(version=...)",
                accepted=self.accepted, current_step=self.current_step, excess=excess)

    def capacity(self) -> int:
        """Groups that may start now (never negative)."""
        with self.lock:
            return self._capacity()

    def _capacity(self) -> int:
        consumer_capacity = (self.max_staleness + self.current_step) * self.batch_size
        return max(0, min(self.max_concurrency - self.running,
                          consumer_capacity - (self.accepted + self.running)))

    def try_start(self) -> int | None:
        """Reserve one slot; return the current step (tag the group with it) or None if full."""
        with self.lock:
            if self._capacity() <= 0:
                return None
            self.running += 1
            self._check_bounds()
            return self.current_step

    def _finish(self, what: str) -> None:
        if self.running <= 0:
            raise InputError(f"{what} called with no group running (accepted={self.accepted}); every "
                             "on_accepted/on_released must match one successful try_start", argument=what)
        self.running -= 1

    def on_accepted(self, started_step: int) -> StalenessViolation | None:
        """A group finished and entered the buffer. Returns (and records) a violation when
        it is more than ``max_staleness`` steps old; the group is kept either way."""
        _positive_int("started_step", started_step, 1)
        with self.lock:
            if started_step > self.current_step:
                raise InputError(f"started_step {started_step} is ahead of current_step {self.current_step}",
                                 argument="started_step")
            self._finish("on_accepted")
            self.accepted += 1
            self._check_bounds()
            staleness = self.current_step - started_step
            if staleness <= self.max_staleness:
                return None
            violation = StalenessViolation(started_step, self.current_step, staleness, self.max_staleness)
            self.violations.append(violation)
            return violation

    def check_bounds(self) -> None:
        """Raise CapacityError unless ``running <= max_concurrency`` and ``accepted + running <=
        (max_staleness + current_step) * batch_size`` (the rule's two bounds)."""
        with self.lock:
            self._check_bounds()

    def _check_bounds(self) -> None:
        consumer_capacity = (self.max_staleness + self.current_step) * self.batch_size
        if not 0 <= self.running <= self.max_concurrency or self.accepted + self.running > consumer_capacity:
            raise CapacityError(f"staleness capacity exceeded: running {self.running} (max {self.max_concurrency}), "
                                f"accepted + running {self.accepted + self.running} > (max_staleness "
                                f"{self.max_staleness} + step {self.current_step}) x {self.batch_size} = "
                                f"{consumer_capacity}; every group must start through try_start",
                                running=self.running, accepted=self.accepted, current_step=self.current_step)

    def on_released(self) -> None:
        """A group finished without entering the buffer (filtered, failed, aborted): frees its slot."""
        with self.lock:
            self._finish("on_released")
            self.released += 1

    def advance(self) -> int:
        """The trainer finished a step and synced weights: one more batch of headroom."""
        with self.lock:
            self.current_step += 1
            return self.current_step

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {"current_step": self.current_step, "accepted": self.accepted, "running": self.running,
                    "released": self.released, "capacity": self._capacity(),
                    "num_violations": len(self.violations)}
