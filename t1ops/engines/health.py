"""Engine health for the pool: the pinger, admission of a started engine, and declaring one dead.

Owned by :class:`t1ops.engines.pool.EnginePool` (whose docstring holds the contract): a
background pinger sends ``/health_generate`` to every engine every ``health_interval_s``;
``failure_threshold`` consecutive misses (outside the warm-up grace) declare an engine dead,
as does its owned process exiting. A starting engine is admitted on its first healthy ping
once it holds the pool's weights. A dead engine's process is killed and the callers of its
requests in flight are woken to resubmit.

Nothing here dies silently (swallowed-engine-death, rl.engines.background): an engine whose
own background loop died answers 503 to pings (dead after ``failure_threshold`` of them) and to
every request (dead at once, :mod:`t1ops.engines.requests`); an exception
in a ping future is recorded (``engine.ping_crashed``) and counts as a missed ping; the
pinger thread itself is supervised (``engine.pinger_died``, then restarted).
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Callable

from rl.engines.background import report_errors, supervised_thread
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.checks import BarrierChecks
from t1ops.engines.slots import ENGINE_FAILURES, Slot, SlotTable
from t1ops.guards.weight_sync import WeightSync

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "dead-engine": ("engine.health_interval_s", "engine.failure_threshold", "engine.max_resubmits"),
    "engine-warmup-grace": ("engine.warmup_grace_s", "engine.failure_threshold"),
    "swallowed-engine-death": ("engine.health_interval_s", "engine.failure_threshold", "engine.max_resubmits"),
}


class Health:
    """Pinging, admission and death of the engines of one :class:`SlotTable`."""

    def __init__(self, table: SlotTable, cfg: EngineConfig, *, weight_sync: WeightSync, checks: BarrierChecks,
                 num_engines: int, none_left: Callable[[], object] = lambda: None) -> None:
        self.table, self.cfg, self.clock, self.weight_sync, self.checks = table, cfg, table.clock, weight_sync, checks
        self.none_left = none_left  # called after a ping round that finds every slot dead (Barrier.recreate_if_none_left)
        self.ping_pool = cf.ThreadPoolExecutor(max(4, num_engines), thread_name_prefix="engine-ping")
        self.stop = threading.Event()
        self.pinger: threading.Thread | None = None

    def start(self) -> None:
        """Start the background pinger (supervised: restarted if its loop dies)."""
        self.pinger = supervised_thread(self._ping_loop, name="engine-pinger", on_death=self._pinger_died)

    def close(self, join_s: float) -> None:
        self.stop.set()
        if self.pinger is not None:
            self.pinger.join(timeout=join_s)
        self.ping_pool.shutdown(wait=False, cancel_futures=True)

    def live_slots(self) -> list[int]:
        return self.table.live_slots()

    def _ping_loop(self) -> None:
        while not self.stop.wait(self.cfg.health_interval_s):
            self.ping_round(wait=False)
            if all(s.status == "dead" for s in self.table.slots):
                self.none_left()

    def _pinger_died(self, reason: str) -> None:
        """The pinger's loop raised: say so and start it again (a pool without pings misses every death)."""
        telemetry.event("engine.pinger_died", severity="error", reason=reason[:300])
        if not self.stop.is_set():
            self.pinger = supervised_thread(self._ping_loop, name="engine-pinger", on_death=self._pinger_died)

    def ping_round(self, *, wait: bool = True) -> None:
        """Ping every starting/live engine that has no ping pending (the pinger calls this)."""
        futures = []
        with self.table.cond:
            for s in self.table.slots:
                if s.status != "dead" and s.handle is not None and not s.ping_pending and not self.table.syncing:
                    s.ping_pending = True
                    futures.append(report_errors(self.ping_pool.submit(self._ping, s),
                                                 lambda why, s=s: self._ping_crashed(s, why), "ping"))
        if wait:
            cf.wait(futures)

    def _ping(self, s: Slot) -> None:
        try:
            if self.exited(s):
                return
            try:
                healthy, err = s.handle.client.health_generate(), "HTTP 503"
            except ENGINE_FAILURES as e:
                healthy, err = False, f"{type(e).__name__}: {e}"
            if healthy:
                s.consecutive_failures = 0
                if s.status == "starting":
                    self._admit(s)
                return
            self._missed_ping(s, err)
        finally:
            s.ping_pending = False

    def _ping_crashed(self, s: Slot, why: str) -> None:
        telemetry.event("engine.ping_crashed", severity="error", slot=s.index, reason=why[:300])
        self._missed_ping(s, why)

    def _missed_ping(self, s: Slot, err: str) -> None:
        age_s = self.clock() - s.started_at
        if self.table.syncing:
            return  # paused engines do not generate; the barrier checks them itself
        if age_s < self.cfg.warmup_grace_s:
            telemetry.event("engine.ping_missed_in_grace", severity="warning", slot=s.index, age_s=round(age_s, 2),
                            grace_s=self.cfg.warmup_grace_s, error=err[:200])
            return
        s.consecutive_failures += 1
        telemetry.count("engine.ping_failed", slot=s.index)
        if s.consecutive_failures >= self.cfg.failure_threshold:
            self.table.declare_dead(s, f"{s.consecutive_failures} consecutive failed health pings "
                                  f"(threshold {self.cfg.failure_threshold}); last: {err[:200]}")

    def exited(self, s: Slot) -> bool:
        proc = s.handle.process if s.handle else None
        if proc is not None and proc.poll() is not None:
            code = proc.returncode
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self.table.declare_dead(s, f"engine process {proc.pid} {how}")
            return True
        return False

    def _admit(self, s: Slot) -> None:
        """First healthy ping of a starting engine: bring it to the pool's version, then rotate it in."""
        with self.table.sync_lock:  # never interleave with a barrier
            try:
                if s.handle.client.weight_version() != self.table.version:
                    if not self.weight_sync.admits_alone:  # joins at the next barrier (weight_sync.py)
                        if not s.awaiting_weights:
                            with self.table.cond:
                                s.awaiting_weights = True
                                self.table.cond.notify_all()
                            telemetry.event("engine.awaiting_weights", slot=s.index, url=s.handle.url)
                        return
                    self.weight_sync.admit(s.handle.client, self.table.admit_source or self.table.checkpoint_dir,
                                          self.table.version)
                    bad = self.checks.admission_mismatch(s, self.table.version)
                    if bad:
                        self.table.declare_dead(s, f"admission: loaded weights of {self.table.version!r} differ from the "
                                              f"trainer's in {len(bad)} tensor(s) (first: {bad[:3]})")
                        return
            except ENGINE_FAILURES as e:
                self.table.declare_dead(s, f"admission failed: {e}")
                return
            with self.table.cond:
                if s.status == "starting":
                    s.status = "live"
                    self.table.cond.notify_all()
        telemetry.event("engine.admitted", slot=s.index, url=s.handle.url, version=self.table.version,
                        startup_s=round(self.clock() - s.started_at, 3))
        telemetry.gauge("engine.live", len(self.live_slots()))
