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
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import httpx

from rl.engines import protocol as P
from rl.engines.client import EngineClient
from rl.engines.ports import free_port
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.guards.weight_sync import CheckpointDirSync, WeightSync
from t1ops.errors import ControlPlaneTimeout, EngineDeadError, EngineError, InputError

RUNBOOK = "runbooks/dead-engine.md"
#: Errors that mean "this engine failed the call" (as opposed to bad data).
ENGINE_FAILURES = (EngineError, ControlPlaneTimeout, httpx.TransportError)
Status = Literal["starting", "live", "dead"]


@dataclass
class EngineHandle:
    """A started engine: its client and, when the pool owns it, its process."""

    url: str
    client: EngineClient
    process: subprocess.Popen | None = None


EngineFactory = Callable[[int], EngineHandle]  # slot -> a freshly started engine (may still be compiling)


@dataclass
class _Ticket:
    """One request in flight on one engine; ``wake`` is set when it finishes or its engine dies."""

    version: str
    num_syncs: int  # barriers begun before admission: a later one explains an abort
    wake: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Slot:
    index: int
    handle: EngineHandle | None  # None while the factory is still starting the engine
    started_at: float
    status: Status = "starting"
    consecutive_failures: int = 0
    ping_pending: bool = False
    last_used: int = -1
    dead_reason: str = ""
    awaiting_weights: bool = False  # healthy, at another version; the next barrier brings it in
    in_flight: dict[int, _Ticket] = field(default_factory=dict)


@dataclass(frozen=True)
class SyncReport:
    """What one weight sync did."""

    version: str
    live_slots: tuple[int, ...]
    dead_slots: tuple[int, ...]
    recreated_slots: tuple[int, ...]
    num_aborted_in_flight: int
    duration_s: float


def spawn_factory(spawn: Callable[[int], subprocess.Popen], http: Any, *, host: str = "127.0.0.1",
                  **client_kw: Any) -> EngineFactory:
    """Factory starting each engine as ``spawn(port)`` on a fresh loopback port.

    ``http`` is the transport shared by the clients (a ``BoundedHttp`` when guarded);
    ``client_kw`` goes to :class:`EngineClient` (``num_moe_layers``, ``topk``, ``num_experts``).
    """
    def make(slot: int) -> EngineHandle:
        port = free_port(host)
        url = f"http://{host}:{port}"
        return EngineHandle(url=url, client=EngineClient(url, http, **client_kw), process=spawn(port))
    return make


def url_factory(urls: Sequence[str], http: Any, **client_kw: Any) -> EngineFactory:
    """Factory for external SGLang servers (``engine.kind = "sglang"``): slot ``i`` is ``urls[i]``.

    The pool does not own these processes, so "recreating" a dead slot means
    re-admitting the same URL once it answers again (its operator restarts it).
    """
    def make(slot: int) -> EngineHandle:
        if not 0 <= slot < len(urls):
            raise InputError(f"engine slot {slot} has no URL: {len(urls)} urls given; set engine.urls to "
                             "one URL per engine (engine.num_engines)", slot=slot, num_urls=len(urls))
        return EngineHandle(url=urls[slot], client=EngineClient(urls[slot], http, **client_kw))
    return make


class EnginePool:
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
        self._slots: list[_Slot] = []
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
            self._slots = [_Slot(index=i, handle=None, started_at=self.clock())
                           for i in range(self.cfg.num_engines)]
        cf.wait([self._spawner.submit(self._spawn_into, i) for i in range(self.cfg.num_engines)])
        if pinger:
            self._pinger = threading.Thread(target=self._ping_loop, name="engine-pinger", daemon=True)
            self._pinger.start()

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
            _kill(s.handle.process if s.handle else None)
        self._gen_pool.shutdown(wait=False, cancel_futures=True)
        self._ping_pool.shutdown(wait=False, cancel_futures=True)

    def live_slots(self) -> list[int]:
        return [s.index for s in self._slots if s.status == "live"]

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

    def report_failure(self, index: int, url: str, reason: str, *, wrong_version: bool = False) -> None:
        """A direct caller's call on engine ``index`` at ``url`` failed: an engine that answered under a
        version the pool never published is dead now; otherwise an exited process is (else the pinger judges)."""
        s = self._slots[index] if 0 <= index < len(self._slots) else None
        if s is None or s.handle is None or s.handle.url != url or s.status != "live":
            return  # already handled, or a replacement now holds the slot
        if wrong_version:
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
            _kill(handle.process)
            return
        with self._cond:
            s = self._slots[index]
            s.handle, s.started_at = handle, self.clock()
        telemetry.event("engine.started", slot=index, url=handle.url,
                        pid=handle.process.pid if handle.process else None)

    # --- health ----------------------------------------------------------------------
    def _ping_loop(self) -> None:
        while not self._stop.wait(self.cfg.health_interval_s):
            self.ping_round(wait=False)

    def ping_round(self, *, wait: bool = True) -> None:
        """Ping every starting/live engine that has no ping pending (the pinger calls this)."""
        futures = []
        with self._cond:
            for s in self._slots:
                if s.status != "dead" and s.handle is not None and not s.ping_pending and not self._syncing:
                    s.ping_pending = True
                    futures.append(self._ping_pool.submit(self._ping, s))
        if wait:
            cf.wait(futures)

    def _ping(self, s: _Slot) -> None:
        try:
            if self._exited(s):
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

    def _missed_ping(self, s: _Slot, err: str) -> None:
        age_s = self.clock() - s.started_at
        if self._syncing:
            return  # paused engines do not generate; the barrier checks them itself
        if age_s < self.cfg.warmup_grace_s:
            telemetry.event("engine.ping_missed_in_grace", severity="warning", slot=s.index, age_s=round(age_s, 2),
                            grace_s=self.cfg.warmup_grace_s, error=err[:200])
            return
        s.consecutive_failures += 1
        telemetry.count("engine.ping_failed", slot=s.index)
        if s.consecutive_failures >= self.cfg.failure_threshold:
            self._declare_dead(s, f"{s.consecutive_failures} consecutive failed health pings "
                                  f"(threshold {self.cfg.failure_threshold}); last: {err[:200]}")

    def _exited(self, s: _Slot) -> bool:
        proc = s.handle.process if s.handle else None
        if proc is not None and proc.poll() is not None:
            code = proc.returncode
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self._declare_dead(s, f"engine process {proc.pid} {how}")
            return True
        return False

    def _admit(self, s: _Slot) -> None:
        """First healthy ping of a starting engine: bring it to the pool's version, then rotate it in."""
        with self._sync_lock:  # never interleave with a barrier
            try:
                if s.handle.client.weight_version() != self.version:
                    if not self.weight_sync.admits_alone:  # joins at the next barrier (weight_sync.py)
                        if not s.awaiting_weights:
                            with self._cond:
                                s.awaiting_weights = True
                                self._cond.notify_all()
                            telemetry.event("engine.awaiting_weights", slot=s.index, url=s.handle.url)
                        return
                    self.weight_sync.admit(s.handle.client, self.checkpoint_dir, self.version)
            except ENGINE_FAILURES as e:
                self._declare_dead(s, f"admission failed: {e}")
                return
            with self._cond:
                if s.status == "starting":
                    s.status = "live"
                    self._cond.notify_all()
        telemetry.event("engine.admitted", slot=s.index, url=s.handle.url, version=self.version,
                        startup_s=round(self.clock() - s.started_at, 3))
        telemetry.gauge("engine.live", len(self.live_slots()))

    def _declare_dead(self, s: _Slot, reason: str) -> None:
        with self._cond:
            if s.status == "dead":
                return
            s.status, s.dead_reason = "dead", reason
            tickets = list(s.in_flight.values())
            self._cond.notify_all()
        for t in tickets:
            t.wake.set()  # callers abandon the call and resubmit
        _kill(s.handle.process if s.handle else None)
        telemetry.count("engine.dead", slot=s.index)
        telemetry.gauge("engine.live", len(self.live_slots()))
        telemetry.event("engine.dead", severity="error", slot=s.index, url=s.handle.url if s.handle else None,
                        reason=reason,
                        num_in_flight=len(tickets), age_s=round(self.clock() - s.started_at, 3))

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

    def _admit_request(self, avoid: set[int]) -> tuple[_Slot, int, _Ticket]:
        """Wait for an open gate and a live engine; register the request as in flight on it."""
        def pick() -> _Slot | None:
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
            ticket_id, ticket = next(self._tickets), _Ticket(version=self.version, num_syncs=self._num_syncs)
            s.in_flight[ticket_id], s.last_used = ticket, ticket_id
            return s, ticket_id, ticket

    def _run(self, s: _Slot, ticket_id: int, ticket: _Ticket,
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
                self._exited(s)  # a refused connection from a killed process: dead now, not in N pings
                return f"{type(e).__name__}: {e}"
            if not resp.finish_reason.is_abort and not self._versions_ok(ticket, resp):
                self._declare_dead(s, f"answered with weight version {resp.weight_version!r} "
                                      f"(spans {[v.version for v in resp.weight_versions]}) for a request "
                                      f"admitted under {ticket.version!r} (pool now {self.version!r}): it "
                                      "missed a weight sync")
                return f"version mismatch on engine {s.index}"
            return resp
        finally:
            with self._cond:
                s.in_flight.pop(ticket_id, None)
                self._cond.notify_all()

    def _versions_ok(self, ticket: _Ticket, resp: P.GenerateResponse) -> bool:
        return response_versions_ok(resp, ticket.version, self._history, self.pause_mode)

    # --- the weight-sync barrier -----------------------------------------------------------
    def sync_weights(self, checkpoint_dir: str, version: str,
                     rotate_snapshot: Callable[[str], None] | None = None) -> SyncReport:
        """Publish ``checkpoint_dir`` as ``version`` to every live engine, inside one barrier.

        On return every live engine serves ``version`` and ``rotate_snapshot(version)``
        has run while no request was in flight. Replacements for dead engines are
        started here and admitted by the pinger once they load ``checkpoint_dir``.
        If no engine took the new weights, raises :class:`EngineDeadError` and leaves
        the gate closed (no request may be served by stale weights).
        """
        if not version or version == self.version:
            raise InputError(f"sync_weights(version={version!r}): must be new (current {self.version!r})")
        t0 = self.clock()
        with self._sync_lock:
            with self._cond:
                self._gate_open, self._syncing = False, True
                self._num_syncs += 1
                live = [s for s in self._slots if s.status == "live"]
                num_in_flight = sum(len(s.in_flight) for s in live)
            for s in live:
                self._control(s, "pause", lambda c: c.pause_generation(self.pause_mode))
            if self.pause_mode == "abort":
                self._drain()  # in place: paused requests stay on their engine and resume after the sync
            waiting = [s for s in self._slots if s.status == "starting" and s.awaiting_weights]
            failures = self.weight_sync.publish([(s.index, s.handle.client) for s in self._live_of(live) + waiting],
                                                checkpoint_dir, version)
            for s in self._live_of(live) + waiting:
                if s.index in failures:
                    self._declare_dead(s, f"publish failed during weight sync: {failures[s.index]}")
            self._admit_waiting(waiting)
            published = self._live_of(live)
            if live and not published:
                raise EngineDeadError(f"weight sync to {version!r} from {checkpoint_dir} failed on every engine: "
                                      f"{self.describe()}; generation stays paused. See {RUNBOOK}")
            self.version, self.checkpoint_dir = version, checkpoint_dir
            self._history.append(version)
            if rotate_snapshot is not None:
                rotate_snapshot(version)  # inside the barrier: the ratio's denominator = the sampling policy
            recreated = self._recreate_dead()
            for s in published:
                self._control(s, "resume", lambda c: c.continue_generation())
            with self._cond:
                self._gate_open, self._syncing = True, False
                self._cond.notify_all()
        report = SyncReport(version=version, live_slots=tuple(self.live_slots()),
                            dead_slots=tuple(s.index for s in self._slots if s.status == "dead"),
                            recreated_slots=recreated, num_aborted_in_flight=num_in_flight,
                            duration_s=self.clock() - t0)
        telemetry.observe("engine.sync_s", report.duration_s)
        telemetry.event("engine.weight_sync", version=version, num_live=len(report.live_slots),
                        recreated=str(list(recreated)), num_aborted=num_in_flight)
        return report

    def _live_of(self, slots: list[_Slot]) -> list[_Slot]:
        return [s for s in slots if s.status == "live"]

    def _control(self, s: _Slot, what: str, call: Callable[[EngineClient], Any]) -> None:
        if s.status != "live":
            return
        try:
            call(s.handle.client)
        except ENGINE_FAILURES as e:
            self._declare_dead(s, f"{what} failed during weight sync: {e}")

    def _admit_waiting(self, waiting: list[_Slot]) -> None:
        """Engines that received this barrier's weights join rotation (resumed with the others)."""
        for s in waiting:
            with self._cond:
                if s.status != "starting":
                    continue
                s.status = "live"
                self._cond.notify_all()
            telemetry.event("engine.admitted", slot=s.index, url=s.handle.url, at_barrier=True,
                            startup_s=round(self.clock() - s.started_at, 3))

    def publish_to_waiting(self) -> tuple[int, ...]:
        """Bring engines that await weights to the pool's current version now (start-up of distributed
        sync: no request is in flight on them, so no pause is needed); returns the slots admitted."""
        with self._sync_lock:
            waiting = [s for s in self._slots if s.status == "starting" and s.awaiting_weights]
            if not waiting:
                return ()
            failures = self.weight_sync.publish([(s.index, s.handle.client) for s in waiting], self.checkpoint_dir,
                                                self.version)
            for s in waiting:
                if s.index in failures:
                    self._declare_dead(s, f"publish failed at admission: {failures[s.index]}")
            self._admit_waiting([s for s in waiting if s.index not in failures])
        return tuple(s.index for s in waiting if s.index not in failures)

    def wait_until_ready(self, timeout_s: float | None = None) -> None:
        """Block until every slot is live or healthy and awaiting weights (distributed sync's start-up)."""
        limit_s = self.cfg.warmup_grace_s + self.cfg.failure_threshold * self.cfg.health_interval_s \
            if timeout_s is None else timeout_s
        ready = lambda: all(s.status == "live" or (s.status == "starting" and s.awaiting_weights)  # noqa: E731
                            for s in self._slots)
        with self._cond:
            if not self._cond.wait_for(lambda: ready() or any(s.status == "dead" for s in self._slots),
                                       timeout=limit_s) or not ready():
                raise EngineDeadError(f"engines not ready within {limit_s:g} s: {self.describe()}. See {RUNBOOK}")

    def _drain(self) -> None:
        """Wait (bounded) for the aborted requests to come back.

        A request sent just as the gate closed can reach an engine after its pause
        and wait there until ``continue_generation``; it then runs wholly under the
        new version, so the barrier does not wait for it (nor kill its engine).
        """
        limit_s = self.cfg.request_timeout_s * self.cfg.request_attempts
        with self._cond:
            drained = self._cond.wait_for(lambda: not any(s.in_flight for s in self._slots), timeout=limit_s)
            num_waiting = sum(len(s.in_flight) for s in self._slots)
        if not drained:
            telemetry.event("engine.sync_requests_held", severity="info", num_requests=num_waiting,
                            waited_s=limit_s)

    def _recreate_dead(self) -> tuple[int, ...]:
        """Start a replacement for every dead slot (in the background; admitted by the pinger)."""
        recreated = []
        for old in list(self._slots):
            if old.status != "dead":
                continue
            with self._cond:
                self._slots[old.index] = _Slot(index=old.index, handle=None, started_at=self.clock())
            self._spawner.submit(self._spawn_into, old.index)
            recreated.append(old.index)
            telemetry.count("engine.recreated", slot=old.index)
            telemetry.event("engine.recreated", severity="warning", slot=old.index, previous=old.dead_reason[:200])
        return tuple(recreated)


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


def _kill(proc: subprocess.Popen | None) -> None:
    """SIGKILL an owned engine process (it may be hung or stopped) and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        telemetry.event("engine.kill_unreaped", severity="error", pid=proc.pid)
