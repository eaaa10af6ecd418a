"""The weight-sync barrier of the engine pool: quiesce, publish, check, rotate, recreate, resume.

Owned by :class:`t1ops.engines.pool.EnginePool` (whose docstring holds the contract).
Report, section 03: weights are published once per step "with generation quiesced first so no
request spans two policy versions", and "the behaviour snapshot rotates inside the same
barrier"; section 08: dead engines are recreated "at the next weight sync". Inside the barrier
it proves every engine loaded what the trainer sent and resumed (:mod:`t1ops.engines.checks`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from rl.engines.client import EngineClient
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.errors import EngineDeadError, InputError
from t1ops.engines.checks import BarrierChecks
from t1ops.engines.slots import ENGINE_FAILURES, RUNBOOK, Slot, SlotTable
from t1ops.guards.weight_sync import WeightSync


@dataclass(frozen=True)
class SyncReport:
    """What one weight sync did."""

    version: str
    live_slots: tuple[int, ...]
    dead_slots: tuple[int, ...]
    recreated_slots: tuple[int, ...]
    num_aborted_in_flight: int
    duration_s: float


class Barrier:
    """:meth:`sync_weights` and the start-up publication of distributed weight sync, over one
    :class:`SlotTable`; ``respawn(index)`` starts a replacement engine in slot ``index`` (in the background)."""

    def __init__(self, table: SlotTable, cfg: EngineConfig, *, weight_sync: WeightSync, checks: BarrierChecks,
                 respawn: Callable[[int], None], pause_mode: Literal["abort", "in_place"]) -> None:
        self.table, self.cfg, self.weight_sync, self.checks = table, cfg, weight_sync, checks
        self.respawn, self.pause_mode, self.clock = respawn, pause_mode, table.clock

    def sync_weights(self, checkpoint_dir: str, version: str,
                     rotate_snapshot: Callable[[str], None] | None = None) -> SyncReport:
        """Publish ``checkpoint_dir`` as ``version`` to every live engine, inside one barrier.

        On return every live engine serves ``version`` and ``rotate_snapshot(version)``
        has run while no request was in flight. Replacements for dead engines are
        started here and admitted by the pinger once they load ``checkpoint_dir``.
        If no engine took the new weights, raises :class:`EngineDeadError` and leaves
        the gate closed (no request may be served by stale weights).
        """
        if not version or version == self.table.version:
            raise InputError(f"sync_weights(version={version!r}): must be new (current {self.table.version!r})")
        t0 = self.clock()
        with self.table.sync_lock:
            with self.table.cond:
                self.table.gate_open, self.table.syncing = False, True
                self.table.num_syncs += 1
                live = [s for s in self.table.slots if s.status == "live"]
                num_in_flight = sum(len(s.in_flight) for s in live)
            for s in live:
                self._control(s, "pause", lambda c: c.pause_generation(self.pause_mode))
            if self.pause_mode == "abort":
                self._drain()  # in place: paused requests stay on their engine and resume after the sync
            waiting = [s for s in self.table.slots if s.status == "starting" and s.awaiting_weights]
            failures = self.weight_sync.publish([(s.index, s.handle.client) for s in self._live_of(live) + waiting],
                                                checkpoint_dir, version)
            for s in self._live_of(live) + waiting:
                if s.index in failures:
                    self.table.declare_dead(s, f"publish failed during weight sync: {failures[s.index]}")
            self.checks.verify_loaded(self._live_of(live) + [s for s in waiting if s.status == "starting"],
                                checkpoint_dir, version)  # a mismatch is re-synced before any traffic
            self._admit_waiting(waiting)
            published = self._live_of(live)
            if live and not published:
                raise EngineDeadError(f"weight sync to {version!r} from {checkpoint_dir} failed on every engine: "
                                      f"{self.table.describe()}; generation stays paused. See {RUNBOOK}")
            self.table.version, self.table.checkpoint_dir = version, checkpoint_dir
            self.table.history.append(version)
            if rotate_snapshot is not None:
                rotate_snapshot(version)  # inside the barrier: the ratio's denominator = the sampling policy
            for s in published:
                self._control(s, "resume", lambda c: c.continue_generation())
            self.checks.prove_resumed(published, version)  # acknowledged is not resumed: a probe must generate
            recreated = self._recreate_dead()
            with self.table.cond:
                self.table.gate_open, self.table.syncing = True, False
                self.table.cond.notify_all()
        report = SyncReport(version=version, live_slots=tuple(self.table.live_slots()),
                            dead_slots=tuple(s.index for s in self.table.slots if s.status == "dead"),
                            recreated_slots=recreated, num_aborted_in_flight=num_in_flight,
                            duration_s=self.clock() - t0)
        telemetry.observe("engine.sync_s", report.duration_s)
        telemetry.event("engine.weight_sync", version=version, num_live=len(report.live_slots),
                        recreated=str(list(recreated)), num_aborted=num_in_flight)
        return report

    def _live_of(self, slots: list[Slot]) -> list[Slot]:
        return [s for s in slots if s.status == "live"]

    def _control(self, s: Slot, what: str, call: Callable[[EngineClient], Any]) -> None:
        if s.status != "live":
            return
        try:
            call(s.handle.client)
        except ENGINE_FAILURES as e:
            self.table.declare_dead(s, f"{what} failed during weight sync: {e}")

    def _admit_waiting(self, waiting: list[Slot]) -> None:
        """Engines that received this barrier's weights join rotation (resumed with the others)."""
        for s in waiting:
            with self.table.cond:
                if s.status != "starting":
                    continue
                s.status = "live"
                self.table.cond.notify_all()
            telemetry.event("engine.admitted", slot=s.index, url=s.handle.url, at_barrier=True,
                            startup_s=round(self.clock() - s.started_at, 3))

    def publish_to_waiting(self) -> tuple[int, ...]:
        """Bring engines that await weights to the pool's current version now (start-up of distributed
        sync: no request is in flight on them, so no pause is needed); returns the slots admitted."""
        with self.table.sync_lock:
            waiting = [s for s in self.table.slots if s.status == "starting" and s.awaiting_weights]
            if not waiting:
                return ()
            failures = self.weight_sync.publish([(s.index, s.handle.client) for s in waiting], self.table.checkpoint_dir,
                                                self.table.version)
            for s in waiting:
                if s.index in failures:
                    self.table.declare_dead(s, f"publish failed at admission: {failures[s.index]}")
            self.checks.verify_loaded([s for s in waiting if s.status == "starting"], self.table.checkpoint_dir, self.table.version)
            self._admit_waiting([s for s in waiting if s.status == "starting"])
        return tuple(s.index for s in waiting if s.status == "live")

    def wait_until_ready(self, timeout_s: float | None = None) -> None:
        """Block until every slot is live or healthy and awaiting weights (distributed sync's start-up)."""
        limit_s = self.cfg.warmup_grace_s + self.cfg.failure_threshold * self.cfg.health_interval_s \
            if timeout_s is None else timeout_s
        ready = lambda: all(s.status == "live" or (s.status == "starting" and s.awaiting_weights)  # noqa: E731
                            for s in self.table.slots)
        with self.table.cond:
            if not self.table.cond.wait_for(lambda: ready() or any(s.status == "dead" for s in self.table.slots),
                                       timeout=limit_s) or not ready():
                raise EngineDeadError(f"engines not ready within {limit_s:g} s: {self.table.describe()}. See {RUNBOOK}")

    def _drain(self) -> None:
        """Wait (bounded) for the aborted requests to come back.

        A request sent just as the gate closed can reach an engine after its pause
        and wait there until ``continue_generation``; it then runs wholly under the
        new version, so the barrier does not wait for it (nor kill its engine).
        """
        limit_s = self.cfg.request_timeout_s * self.cfg.request_attempts
        with self.table.cond:
            drained = self.table.cond.wait_for(lambda: not any(s.in_flight for s in self.table.slots), timeout=limit_s)
            num_waiting = sum(len(s.in_flight) for s in self.table.slots)
        if not drained:
            telemetry.event("engine.sync_requests_held", severity="info", num_requests=num_waiting,
                            waited_s=limit_s)

    def recreate_if_none_left(self) -> tuple[int, ...]:
        """Every slot dead, outside a barrier: start replacements now, not at the next sync.

        The next sync waits for the rollout in flight, and that rollout waits for a live engine: with
        the whole fleet dead, "recreate at the next sync" (report, section 08) never comes
        (docs/engine.md). A barrier in progress recreates them itself, so this one never waits for it.
        """
        if not self.table.sync_lock.acquire(blocking=False):
            return ()
        try:
            with self.table.cond:
                if self.table.syncing or any(s.status != "dead" for s in self.table.slots):
                    return ()
            telemetry.event("engine.none_left", severity="error", num_engines=len(self.table.slots),
                            version=self.table.version)
            return self._recreate_dead()
        finally:
            self.table.sync_lock.release()

    def _recreate_dead(self) -> tuple[int, ...]:
        """Start a replacement for every dead slot (in the background; admitted by the pinger)."""
        recreated = []
        for old in list(self.table.slots):
            if old.status != "dead":
                continue
            with self.table.cond:
                self.table.slots[old.index] = Slot(index=old.index, handle=None, started_at=self.clock())
            self.respawn(old.index)
            recreated.append(old.index)
            telemetry.count("engine.recreated", slot=old.index)
            telemetry.event("engine.recreated", severity="warning", slot=old.index, previous=old.dead_reason[:200])
        return tuple(recreated)

