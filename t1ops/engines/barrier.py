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
from t1ops.guards.weight_sync import Pushed, WeightSync, push


@dataclass(frozen=True)
class SyncReport:
    """What one weight sync did."""

    version: str
    live_slots: tuple[int, ...]
    dead_slots: tuple[int, ...]
    recreated_slots: tuple[int, ...]
    num_aborted_in_flight: int
    duration_s: float


@dataclass
class _Open:
    """One barrier between :meth:`Barrier.open` and :meth:`Barrier.close`."""

    version: str
    checkpoint_dir: str
    live: list[Slot]       # live when the barrier began: published unless they fail
    waiting: list[Slot]    # healthy at another version (distributed sync): joined by this barrier
    targets: list[Slot]    # the engines the pusher must (re)push to now
    num_in_flight: int
    t0: float
    attempt: int = 0       # re-pushes after a checksum mismatch so far
    source: str | None = None


class Barrier:
    """The weight-sync barrier over one :class:`SlotTable` as a transaction (docs/weights.md, "One
    transaction"): :meth:`open` closes the gate, pauses and names the targets; the pusher (the
    trainer, in a campaign) moves the weights and :meth:`pushed` takes its :class:`Pushed` (it may
    name engines to push to again); :meth:`close` rotates, resumes, proves and reopens the gate;
    :meth:`abort` ends a barrier whose push raised (the gate stays closed). :meth:`sync_weights` is
    the same transaction in one process with the pool's own ``WeightSync``. ``respawn(index)``
    starts a replacement engine in slot ``index`` (in the background)."""

    def __init__(self, table: SlotTable, cfg: EngineConfig, *, weight_sync: WeightSync, checks: BarrierChecks,
                 respawn: Callable[[int], None], pause_mode: Literal["abort", "in_place"]) -> None:
        self.table, self.cfg, self.weight_sync, self.checks = table, cfg, weight_sync, checks
        self.respawn, self.pause_mode, self.clock = respawn, pause_mode, table.clock
        self._open: _Open | None = None

    def sync_weights(self, checkpoint_dir: str, version: str,
                     rotate_snapshot: Callable[[str], None] | None = None) -> SyncReport:
        """Publish ``checkpoint_dir`` as ``version`` to every live engine, inside one barrier.

        On return every live engine serves ``version`` and ``rotate_snapshot(version)``
        has run while no request was in flight. Replacements for dead engines are
        started here and admitted by the pinger once they load ``checkpoint_dir``.
        If no engine took the new weights, raises :class:`EngineDeadError` and leaves
        the gate closed (no request may be served by stale weights).
        """
        targets = self.open(checkpoint_dir, version)
        try:
            while targets:
                targets = self.pushed(push(self.weight_sync, targets, checkpoint_dir, version))
        except BaseException as exc:
            self.abort(f"{type(exc).__name__}: {exc}")
            raise
        return self.close(rotate_snapshot)

    # --- the transaction -------------------------------------------------------------------
    def open(self, checkpoint_dir: str, version: str) -> list[tuple[int, EngineClient]]:
        """Close the gate, pause (and in ``abort`` mode drain) the live engines; return the targets:
        the live engines and those awaiting weights. Holds the pool's sync lock until close/abort."""
        if not version or version == self.table.version:
            raise InputError(f"sync_weights(version={version!r}): must be new (current {self.table.version!r})")
        t0 = self.clock()
        self.table.sync_lock.acquire()
        try:
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
            self._open = _Open(version=version, checkpoint_dir=checkpoint_dir, live=live, waiting=waiting,
                               targets=self._live_of(live) + waiting, num_in_flight=num_in_flight, t0=t0)
        except BaseException:
            self.table.sync_lock.release()
            raise
        return [(s.index, s.handle.client) for s in self._open.targets]

    def pushed(self, result: Pushed) -> list[tuple[int, EngineClient]]:
        """Take one push's result: a failed engine is dead; one whose loaded tensors differ from the
        pushed checksums is named again (up to ``engine.weight_resyncs`` times, then dead)."""
        o = self._require_open()
        resync = o.attempt > 0
        for s in o.targets:
            if s.index in result.failures:
                what = "re-sync after a checksum mismatch failed" if resync else "publish failed during weight sync"
                self.table.declare_dead(s, f"{what}: {result.failures[s.index]}")
        o.source = result.source or o.source
        bad = self.checks.loaded_mismatches([s for s in o.targets if s.status != "dead"], result.checksums,
                                            o.version, attempt=o.attempt, t0=o.t0)
        if not bad:
            o.targets = []
        elif o.attempt == self.cfg.weight_resyncs:
            self.checks.give_up(o.targets, bad, o.version, o.attempt)
            o.targets = []
        else:  # a group that cannot admit one engine alone is pushed to whole again
            o.attempt += 1
            o.targets = [s for s in o.targets if s.status != "dead" and (s.index in bad or not self.weight_sync.admits_alone)]
            telemetry.event("engine.weights_resynced", severity="warning", slots=str(sorted(bad)), version=o.version,
                            attempt=o.attempt)
        return [(s.index, s.handle.client) for s in o.targets]

    def close(self, rotate_snapshot: Callable[[str], None] | None = None) -> SyncReport:
        """Admit the engines that joined, publish the version, rotate, resume and prove resumed,
        recreate the dead, reopen the gate. Raises (gate left closed) when no engine took it."""
        o = self._require_open()
        try:
            self._admit_waiting([s for s in o.waiting if s.status == "starting"])
            published = self._live_of(o.live)
            if o.live and not published:
                raise EngineDeadError(f"weight sync to {o.version!r} from {o.checkpoint_dir} failed on every engine: "
                                      f"{self.table.describe()}; generation stays paused. See {RUNBOOK}")
            self.table.version, self.table.checkpoint_dir = o.version, o.checkpoint_dir
            self.table.admit_source = o.source or o.checkpoint_dir
            self.table.history.append(o.version)
            if rotate_snapshot is not None:
                rotate_snapshot(o.version)  # inside the barrier: the ratio's denominator = the sampling policy
            for s in published:
                self._control(s, "resume", lambda c: c.continue_generation())
            self.checks.prove_resumed(published, o.version)  # acknowledged is not resumed: a probe must generate
            recreated = self._recreate_dead()
            with self.table.cond:
                self.table.gate_open, self.table.syncing = True, False
                self.table.cond.notify_all()
        finally:
            self._open = None
            self.table.sync_lock.release()
        report = SyncReport(version=o.version, live_slots=tuple(self.table.live_slots()),
                            dead_slots=tuple(s.index for s in self.table.slots if s.status == "dead"),
                            recreated_slots=recreated, num_aborted_in_flight=o.num_in_flight,
                            duration_s=self.clock() - o.t0)
        telemetry.observe("engine.sync_s", report.duration_s)
        telemetry.event("engine.weight_sync", version=o.version, num_live=len(report.live_slots),
                        recreated=str(list(recreated)), num_aborted=o.num_in_flight)
        return report

    def abort(self, why: str) -> None:
        """The push raised: end the barrier with the gate closed (no engine serves half-synced weights)."""
        o, self._open = self._open, None
        if o is None:
            return
        telemetry.event("engine.sync_aborted", severity="error", version=o.version, reason=why[:300])
        self.table.sync_lock.release()

    def _require_open(self) -> _Open:
        if self._open is None:
            raise InputError("no weight-sync barrier is open: call open(checkpoint_dir, version) first")
        return self._open

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

