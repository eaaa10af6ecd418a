"""Engine pool: health pings, dead-engine handling, recreation, and the weight-sync barrier.

Report, section 08: at 128 GPUs and ~1 h per step "rare" failures are per-run
certainties; dead inference engines are handled by "health pings +
recreation at the next weight sync". Section 03: weights are published once
per step "with generation quiesced first so no request spans two policy
versions", and "the behaviour snapshot rotates inside the same barrier".

Contract of :class:`EnginePool`:

- a background pinger sends ``/health_generate`` to every engine every
  ``health_interval_s`` (bounded by :class:`~t1ops.guards.http.BoundedHttp`);
  ``failure_threshold`` consecutive misses declare an engine dead. A pool that
  owns the engine's process also checks it: an exited process is dead at once.
- warm-up grace: misses within ``warmup_grace_s`` of an engine's start are
  logged (``engine.ping_missed_in_grace``) and not counted, so an engine busy
  in its first compile is not killed (another framework killed engines that
  missed one ping while compiling).
- a dead engine leaves rotation at once; its process is killed; every request
  in flight on it is resubmitted to a live engine, up to ``max_resubmits``
  times, after which :class:`EngineDeadError` is raised: never lost silently.
- :meth:`EnginePool.sync_weights` is the barrier: close the gate, pause every
  live engine (``mode="abort"``: in-flight requests come back aborted and are
  resubmitted after the barrier), wait (bounded) for them to come back, publish the
  checkpoint (``/update_weights_from_disk``, deliberately unbounded), check each
  engine's version, rotate the behaviour snapshot (callback), start
  replacements for dead engines, resume, open the gate.
- ``pause_mode="in_place"`` (fully async, docs/async.md): the barrier pauses
  requests where they are instead of aborting them; they resume under the
  new weights after the sync, so one response may span several versions.
  Each span must name a version this pool published since the request was
  admitted, in order; anything else takes the engine out of rotation as below.
  The gate and the pause still hold: no token is sampled while weights load.
- every response carries ``weight_version``; a response under a version the
  pool did not publish (neither the one current when the request was admitted
  nor the current one), or spanning two versions, takes its engine out of
  rotation and is resubmitted.

Replacements start as ``starting``; the pinger admits one on its first healthy
ping after loading the pool's current checkpoint into it.

Modules: :mod:`t1ops.guards.engine_slots` (handles, slots, factories),
:mod:`t1ops.guards.engine_health` (pinger, admission, death),
:mod:`t1ops.guards.engine_barrier` (the weight-sync barrier); this one holds the pool, its
lifecycle and its traffic (admission of requests, resubmission, the version check).
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import threading
import time
from typing import Callable, Literal, Sequence

from rl.engines import protocol as P
from rl.engines.background import supervised_thread
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.errors import EngineDeadError, EngineError, InputError
from t1ops.guards.engine_barrier import WeightSyncBarrier
from t1ops.guards.engine_slots import (ENGINE_FAILURES, RUNBOOK, EngineFactory, EngineHandle, Slot, Status, Ticket,
                                       kill_engine, reports_failed)
from t1ops.guards.weight_sync import CheckpointDirSync, WeightSync


class EnginePool(WeightSyncBarrier):
    """Engines behind one ``generate`` call, guarded as the module docstring says.

    ``version`` is the weight version the engines start with (SGLang's default
    is ``"default"``); ``checkpoint_dir`` (optional) is loaded into an engine
    that starts at another version.
    ``clock`` is injectable for tests (monotonic seconds).
    """

    def __init__(self, factory: EngineFactory, cfg: EngineConfig, *, version: str = "default",
                 checkpoint_dir: str | None = None, clock: Callable[[], float] = time.monotonic,
                 max_concurrency: int = 64, pause_mode: Literal["abort", "in_place"] = "abort",
                 weight_sync: WeightSync | None = None) -> None:
        if pause_mode not in ("abort", "in_place"):
            raise InputError(f"pause_mode must be 'abort' or 'in_place', got {pause_mode!r}", argument="pause_mode")
        self.factory, self.cfg, self.clock = factory, cfg, clock
        self.weight_sync: WeightSync = weight_sync or CheckpointDirSync()  # how "publish" moves weights
        self.version, self.checkpoint_dir = version, checkpoint_dir
        self.pause_mode = pause_mode
        self._history: list[str] = [version]  # every version published, oldest first
        self._cond = threading.Condition()
        self._sync_lock = threading.Lock()
        self._gate_open, self._syncing, self._num_syncs = True, False, 0
        self._slots: list[Slot] = []
        self._tickets = itertools.count()
        self._gen_pool = cf.ThreadPoolExecutor(max_concurrency, thread_name_prefix="engine-gen")
        self._ping_pool = cf.ThreadPoolExecutor(max(4, cfg.num_engines), thread_name_prefix="engine-ping")
        self._spawner = cf.ThreadPoolExecutor(max(2, cfg.num_engines), thread_name_prefix="engine-spawn")
        self._stop = threading.Event()
        self._pinger: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------
    def start(self, *, pinger: bool = True) -> None:
        """Start ``cfg.num_engines`` engines concurrently, then (by default) the background pinger.

        Returns once every factory call has returned (or failed: that slot is dead);
        engines join rotation when the pinger admits them (:meth:`wait_until_live`).
        """
        with self._cond:
            self._slots = [Slot(index=i, handle=None, started_at=self.clock())
                           for i in range(self.cfg.num_engines)]
        cf.wait([self._spawner.submit(self._spawn_into, i) for i in range(self.cfg.num_engines)])
        if pinger:
            self._pinger = supervised_thread(self._ping_loop, name="engine-pinger", on_death=self._pinger_died)

    def wait_until_live(self, num_live: int | None = None, timeout_s: float | None = None) -> None:
        """Block until ``num_live`` engines (default: all) are admitted, or raise EngineDeadError."""
        want = self.cfg.num_engines if num_live is None else num_live
        limit_s = self.cfg.warmup_grace_s + self.cfg.failure_threshold * self.cfg.health_interval_s \
            if timeout_s is None else timeout_s
        def settled() -> bool:  # enough live, or too many dead to ever get there (until the next sync)
            num_dead = sum(s.status == "dead" for s in self._slots)
            return len(self.live_slots()) >= want or len(self._slots) - num_dead < want
        with self._cond:
            self._cond.wait_for(settled, timeout=limit_s)
            if len(self.live_slots()) < want:
                raise EngineDeadError(f"only {len(self.live_slots())}/{want} engines live after {limit_s:g} s: "
                                      f"{self.describe()}; see {RUNBOOK}", num_live=len(self.live_slots()))

    def close(self) -> None:
        """Stop pinging and kill every engine process the pool owns."""
        self._stop.set()
        if self._pinger is not None:
            self._pinger.join(timeout=self.cfg.request_timeout_s * self.cfg.request_attempts + 5)
        self._spawner.shutdown(wait=True, cancel_futures=True)
        for s in self._slots:
            kill_engine(s.handle.process if s.handle else None)
        self._gen_pool.shutdown(wait=False, cancel_futures=True)
        self._ping_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def gate_open(self) -> bool:
        """False while a weight sync holds new requests back."""
        return self._gate_open

    def num_in_flight(self, index: int | None = None) -> int:
        """Requests in flight on slot ``index`` (all slots when None)."""
        with self._cond:
            slots = self._slots if index is None else [self._slots[index]]
            return sum(len(s.in_flight) for s in slots)

    def slot_state(self, index: int) -> tuple[Status, str, int]:
        """``(status, dead_reason, consecutive_failures)`` of slot ``index``."""
        s = self._slots[index]
        return s.status, s.dead_reason, s.consecutive_failures

    def describe(self) -> str:
        return ", ".join(f"engine {s.index} {s.status}" + (f" ({s.dead_reason})" if s.dead_reason else "")
                         for s in self._slots)

    def view(self) -> dict:
        """What a direct caller (:class:`t1ops.guards.engine_direct.DirectEngines`) needs: the weight
        version, barriers begun, the gate, and ``(slot, url, status)`` of every started engine."""
        with self._cond:
            return {"version": self.version, "num_syncs": self._num_syncs, "gate_open": self._gate_open,
                    "history": list(self._history), "pause_mode": self.pause_mode,  # for response_versions_ok
                    "engines": [(s.index, s.handle.url, s.status) for s in self._slots if s.handle is not None]}

    def report_failure(self, index: int, url: str, reason: str, *, wrong_version: bool = False,
                       engine_failed: bool = False) -> None:
        """A direct caller's call on engine ``index`` at ``url`` failed: an engine that answered under a
        version the pool never published, or that reported itself failed (503), is dead now; otherwise an
        exited process is (else the pinger judges)."""
        s = self._slots[index] if 0 <= index < len(self._slots) else None
        if s is None or s.handle is None or s.handle.url != url or s.status != "live":
            return  # already handled, or a replacement now holds the slot
        if wrong_version or engine_failed:
            self._declare_dead(s, reason)
        elif not self._exited(s):
            telemetry.event("engine.direct_call_failed", severity="warning", slot=index, reason=reason[:200])

    def slot(self, index: int) -> EngineHandle | None:
        """The current handle of slot ``index`` (a recreated engine gets a new one; None while starting)."""
        return self._slots[index].handle

    def _spawn_into(self, index: int) -> None:
        """Run the factory for slot ``index`` (spawner thread); the pinger admits the engine later."""
        try:
            handle = self.factory(index)
        except Exception as err:  # any start failure is this slot's failure: reported, retried next sync
            self._declare_dead(self._slots[index], f"start failed: {type(err).__name__}: {err}")
            return
        if self._stop.is_set():
            kill_engine(handle.process)
            return
        with self._cond:
            s = self._slots[index]
            s.handle, s.started_at = handle, self.clock()
        telemetry.event("engine.started", slot=index, url=handle.url,
                        pid=handle.process.pid if handle.process else None)

    # --- generation --------------------------------------------------------------------
    def generate(self, request: P.GenerateRequest) -> P.GenerateResponse:
        """Generate on a live engine; resubmit if the engine dies or the barrier aborts the request.

        Returns a finished response sampled entirely under ``response.weight_version``.
        Raises :class:`EngineDeadError` after ``max_resubmits`` engine failures,
        :class:`EngineError` when an engine aborts the request outside a barrier, and lets
        data-contract errors (malformed/missing routing) through: those abort the rollout.
        """
        num_failures, avoid = 0, set()
        while True:
            s, ticket_id, ticket = self._admit_request(avoid)
            outcome = self._run(s, ticket_id, ticket, request)
            if isinstance(outcome, P.GenerateResponse):
                if not outcome.finish_reason.is_abort:
                    return outcome
                if ticket.num_syncs == self._num_syncs:  # no barrier explains it: the engine refused it
                    telemetry.count("engine.request_failed", reason="aborted_by_engine")
                    raise EngineError(f"engine {s.index} aborted request {request.rid!r} outside a weight sync: "
                                      f"{outcome.finish_reason.message} (status "
                                      f"{outcome.finish_reason.status_code}); not resubmitted",
                                      rid=request.rid, slot=s.index)
                telemetry.count("engine.request_resubmitted", reason="aborted_by_pause")
                continue  # the barrier paused it: wait for the gate, resubmit; not a failure
            num_failures += 1
            avoid = {s.index}
            if num_failures > self.cfg.max_resubmits:
                telemetry.count("engine.request_failed")
                raise EngineDeadError(
                    f"request {request.rid!r} failed on {num_failures} engines (max_resubmits "
                    f"{self.cfg.max_resubmits}); last: engine {s.index}: {outcome}; pool: {self.describe()}. "
                    f"See {RUNBOOK}", rid=request.rid, num_failures=num_failures)
            telemetry.count("engine.request_resubmitted", reason="engine_failed")
            telemetry.event("engine.request_resubmitted", severity="warning", slot=s.index, rid=request.rid,
                            reason=str(outcome)[:200], attempt=num_failures)

    def _admit_request(self, avoid: set[int]) -> tuple[Slot, int, Ticket]:
        """Wait for an open gate and a live engine; register the request as in flight on it."""
        def pick() -> Slot | None:
            live = [s for s in self._slots if s.status == "live"]
            if not self._gate_open or not live:
                return None
            preferred = [s for s in live if s.index not in avoid] or live
            return min(preferred, key=lambda s: (len(s.in_flight), s.last_used))  # least loaded, then LRU
        with self._cond:
            if not self._cond.wait_for(lambda: pick() is not None, timeout=self.cfg.generate_timeout_s):
                raise EngineDeadError(f"no live engine for {self.cfg.generate_timeout_s:g} s "
                                      f"(gate {'open' if self._gate_open else 'closed'}): {self.describe()}; "
                                      f"dead engines are recreated at the next weight sync. See {RUNBOOK}")
            s = pick()
            ticket_id, ticket = next(self._tickets), Ticket(version=self.version, num_syncs=self._num_syncs)
            s.in_flight[ticket_id], s.last_used = ticket, ticket_id
            return s, ticket_id, ticket

    def _run(self, s: Slot, ticket_id: int, ticket: Ticket,
             request: P.GenerateRequest) -> P.GenerateResponse | str:
        """Run on ``s``; return the response, or a string saying why the engine failed."""
        fut = self._gen_pool.submit(s.handle.client.generate, request)
        fut.add_done_callback(lambda _f: ticket.wake.set())
        try:
            ticket.wake.wait()
            if not fut.done():
                return f"engine {s.index} died with the request in flight ({s.dead_reason})"
            try:
                resp = fut.result()
            except ENGINE_FAILURES as e:
                if reports_failed(e):  # alive but failed (swallowed-engine-death): dead now
                    self._declare_dead(s, f"engine reported itself failed: {e}"[:500])
                else:
                    self._exited(s)  # a refused connection from a killed process: dead now, not in N pings
                return f"{type(e).__name__}: {e}"
            if not resp.finish_reason.is_abort and not self._versions_ok(ticket, resp):
                self._declare_dead(s, missed_sync_reason(resp, ticket.version, self.version))
                return f"version mismatch on engine {s.index}"
            return resp
        finally:
            with self._cond:
                s.in_flight.pop(ticket_id, None)
                self._cond.notify_all()

    def _versions_ok(self, ticket: Ticket, resp: P.GenerateResponse) -> bool:
        return response_versions_ok(resp, ticket.version, self._history, self.pause_mode)


def response_versions_ok(resp: P.GenerateResponse, admitted: str, history: Sequence[str],
                         pause_mode: str = "abort") -> bool:
    """Whether a finished response was sampled only under versions the pool published for it.

    ``admitted``: the pool's version when the request was admitted; ``history``: every version the
    pool published, oldest first (the last is the current one). ``abort`` pause: one version, the
    admitted or the current one. ``in_place`` (fully async): the spans name versions published since
    admission, in publication order, ending at ``resp.weight_version``. Shared by every caller that
    checks responses (the pool, direct callers).
    """
    if pause_mode == "abort":
        return resp.weight_version in (admitted, history[-1]) and not resp.spans_versions
    since = list(history[list(history).index(admitted):]) if admitted in history else []
    seen = [sp.version for sp in resp.weight_versions] or [resp.weight_version]
    positions = [since.index(v) if v in since else -1 for v in seen]
    return min(positions) >= 0 and positions == sorted(positions) and seen[-1] == resp.weight_version


def missed_sync_reason(resp: P.GenerateResponse, admitted: str, current: str) -> str:
    """Why a response that fails :func:`response_versions_ok` takes its engine out of rotation."""
    return (f"answered with weight version {resp.weight_version!r} (spans "
            f"{[v.version for v in resp.weight_versions]}) for a request admitted under "
            f"{admitted!r} (pool now {current!r}): it missed a weight sync")
