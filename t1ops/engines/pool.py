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
  replacements for dead engines, resume, open the gate. It is one transaction,
  :meth:`open_sync` / :meth:`pushed` / :meth:`close_sync`, whose push another
  process may do: in a campaign the coordinator opens it on the router and the
  trainer pushes (docs/weights.md, "One transaction").
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

Modules: :mod:`t1ops.engines.slots` (handles, the slots table, factories),
:mod:`t1ops.engines.health` (pinger, admission), :mod:`t1ops.engines.checks` (the barrier's
proofs), :mod:`t1ops.engines.barrier` (the weight-sync barrier), :mod:`t1ops.engines.requests`
(the one request loop, shared with workers' direct traffic); this one holds the pool: its
lifecycle and how its own traffic picks and reports engines.
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import time
from typing import Callable, Literal

from rl.engines import protocol as P
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.errors import EngineDeadError, InputError
from t1ops.engines import requests
from t1ops.engines.barrier import Barrier, SyncReport
from t1ops.engines.checks import BarrierChecks
from t1ops.engines.health import Health
from t1ops.engines.slots import RUNBOOK, EngineFactory, EngineHandle, Slot, SlotTable, Status, Ticket, kill_engine
from t1ops.guards.weight_sync import CheckpointDirSync, Pushed, WeightSync


class EnginePool:
    """Engines behind one ``generate`` call, guarded as the module docstring says.

    ``version`` is the weight version the engines start with (SGLang's default
    is ``"default"``); ``checkpoint_dir`` (optional) is loaded into an engine
    that starts at another version.
    ``clock`` is injectable for tests (monotonic seconds).

    Composition: one :class:`SlotTable` (the engines and the weight state), read and written by the
    pool's traffic, by a :class:`Health` (pinger, admission) and by a :class:`Barrier` (weight sync),
    both checked by one :class:`BarrierChecks`; each gets its inputs in its constructor.
    """

    def __init__(self, factory: EngineFactory, cfg: EngineConfig, *, version: str = "default",
                 checkpoint_dir: str | None = None, clock: Callable[[], float] = time.monotonic,
                 max_concurrency: int = 64, pause_mode: Literal["abort", "in_place"] = "abort",
                 weight_sync: WeightSync | None = None) -> None:
        if pause_mode not in ("abort", "in_place"):
            raise InputError(f"pause_mode must be 'abort' or 'in_place', got {pause_mode!r}", argument="pause_mode")
        self.factory, self.cfg, self.clock = factory, cfg, clock
        self.weight_sync: WeightSync = weight_sync or CheckpointDirSync()  # how "publish" moves weights
        self.pause_mode = pause_mode
        self.table = SlotTable(version=version, checkpoint_dir=checkpoint_dir, clock=clock)
        self.checks = BarrierChecks(self.table, cfg)
        self.health = Health(self.table, cfg, weight_sync=self.weight_sync, checks=self.checks,
                             num_engines=cfg.num_engines, none_left=lambda: self.barrier.recreate_if_none_left())
        self._spawner = cf.ThreadPoolExecutor(max(2, cfg.num_engines), thread_name_prefix="engine-spawn")
        self.barrier = Barrier(self.table, cfg, weight_sync=self.weight_sync, checks=self.checks,
                               respawn=lambda i: self._spawner.submit(self._spawn_into, i), pause_mode=pause_mode)
        self._tickets = itertools.count()
        self._gen_pool = cf.ThreadPoolExecutor(max_concurrency, thread_name_prefix="engine-gen")

    @property
    def version(self) -> str:
        return self.table.version

    @property
    def checkpoint_dir(self) -> str | None:
        return self.table.checkpoint_dir

    @property
    def _slots(self) -> list[Slot]:
        return self.table.slots

    # --- lifecycle -----------------------------------------------------------------
    def start(self, *, pinger: bool = True) -> None:
        """Start ``cfg.num_engines`` engines concurrently, then (by default) the background pinger.

        Returns once every factory call has returned (or failed: that slot is dead);
        engines join rotation when the pinger admits them (:meth:`wait_until_live`).
        """
        with self.table.cond:
            self.table.slots = [Slot(index=i, handle=None, started_at=self.clock())
                                for i in range(self.cfg.num_engines)]
        cf.wait([self._spawner.submit(self._spawn_into, i) for i in range(self.cfg.num_engines)])
        if pinger:
            self.health.start()

    def wait_until_live(self, num_live: int | None = None, timeout_s: float | None = None) -> None:
        """Block until ``num_live`` engines (default: all) are admitted, or raise EngineDeadError."""
        want = self.cfg.num_engines if num_live is None else num_live
        limit_s = self.cfg.warmup_grace_s + self.cfg.failure_threshold * self.cfg.health_interval_s \
            if timeout_s is None else timeout_s
        t = self.table
        def settled() -> bool:  # enough live, or too many dead to ever get there (until the next sync)
            num_dead = sum(s.status == "dead" for s in t.slots)
            return len(t.live_slots()) >= want or len(t.slots) - num_dead < want
        with t.cond:
            t.cond.wait_for(settled, timeout=limit_s)
            if len(t.live_slots()) < want:
                raise EngineDeadError(f"only {len(t.live_slots())}/{want} engines live after {limit_s:g} s: "
                                      f"{t.describe()}; see {RUNBOOK}", num_live=len(t.live_slots()))

    def close(self) -> None:
        """Stop pinging and kill every engine process the pool owns."""
        self.health.close(join_s=self.cfg.request_timeout_s * self.cfg.request_attempts + 5)
        self._spawner.shutdown(wait=True, cancel_futures=True)
        for s in self.table.slots:
            kill_engine(s.handle.process if s.handle else None)
        self._gen_pool.shutdown(wait=False, cancel_futures=True)

    # --- what the barrier and health do (their objects hold the logic) ------------------
    def sync_weights(self, checkpoint_dir: str, version: str,
                     rotate_snapshot: Callable[[str], None] | None = None) -> SyncReport:
        """:meth:`Barrier.sync_weights`."""
        return self.barrier.sync_weights(checkpoint_dir, version, rotate_snapshot)

    def open_sync(self, checkpoint_dir: str, version: str) -> list[tuple[int, str]]:
        """:meth:`Barrier.open`: the targets as ``(slot, url)`` (what a pusher in another process needs)."""
        return [(i, c.base_url) for i, c in self.barrier.open(checkpoint_dir, version)]

    def pushed(self, result: Pushed) -> list[tuple[int, str]]:
        """:meth:`Barrier.pushed`: the targets to push to again as ``(slot, url)``; [] when done."""
        return [(i, c.base_url) for i, c in self.barrier.pushed(result)]

    def close_sync(self, rotate_snapshot: Callable[[str], None] | None = None) -> SyncReport:
        """:meth:`Barrier.close`."""
        return self.barrier.close(rotate_snapshot)

    def abort_sync(self, why: str) -> None:
        """:meth:`Barrier.abort`."""
        self.barrier.abort(why)

    def wait_until_ready(self, timeout_s: float | None = None) -> None:
        """:meth:`Barrier.wait_until_ready`."""
        self.barrier.wait_until_ready(timeout_s)

    def ping_round(self, *, wait: bool = True) -> None:
        """:meth:`Health.ping_round`."""
        self.health.ping_round(wait=wait)

    def live_slots(self) -> list[int]:
        return self.table.live_slots()

    def describe(self) -> str:
        return self.table.describe()

    @property
    def gate_open(self) -> bool:
        """False while a weight sync holds new requests back."""
        return self.table.gate_open

    def num_in_flight(self, index: int | None = None) -> int:
        """Requests in flight on slot ``index`` (all slots when None)."""
        with self.table.cond:
            slots = self.table.slots if index is None else [self.table.slots[index]]
            return sum(len(s.in_flight) for s in slots)

    def slot_state(self, index: int) -> tuple[Status, str, int]:
        """``(status, dead_reason, consecutive_failures)`` of slot ``index``."""
        s = self.table.slots[index]
        return s.status, s.dead_reason, s.consecutive_failures

    def view(self) -> dict:
        """What a direct caller (:class:`t1ops.engines.direct.DirectEngines`) needs: the weight
        version, barriers begun, the gate, and ``(slot, url, status)`` of every started engine."""
        t = self.table
        with t.cond:
            return {"version": t.version, "num_syncs": t.num_syncs, "gate_open": t.gate_open,
                    "history": list(t.history), "pause_mode": self.pause_mode,  # for response_versions_ok
                    "engines": [(s.index, s.handle.url, s.status) for s in t.slots if s.handle is not None]}

    def report_failure(self, index: int, url: str, reason: str, *, wrong_version: bool = False,
                       engine_failed: bool = False) -> None:
        """A direct caller's call on engine ``index`` at ``url`` failed: an engine that answered under a
        version the pool never published, or that reported itself failed (503), is dead now; otherwise an
        exited process is (else the pinger judges)."""
        slots = self.table.slots
        s = slots[index] if 0 <= index < len(slots) else None
        if s is None or s.handle is None or s.handle.url != url or s.status != "live":
            return  # already handled, or a replacement now holds the slot
        if wrong_version or engine_failed:
            self.table.declare_dead(s, reason)
        elif not self.health.exited(s):
            telemetry.event("engine.direct_call_failed", severity="warning", slot=index, reason=reason[:200])

    def slot(self, index: int) -> EngineHandle | None:
        """The current handle of slot ``index`` (a recreated engine gets a new one; None while starting)."""
        return self.table.slots[index].handle

    def _spawn_into(self, index: int) -> None:
        """Run the factory for slot ``index`` (spawner thread); the pinger admits the engine later."""
        try:
            handle = self.factory(index)
        except Exception as err:  # any start failure is this slot's failure: reported, retried next sync
            self.table.declare_dead(self.table.slots[index], f"start failed: {type(err).__name__}: {err}")
            return
        if self.health.stop.is_set():
            kill_engine(handle.process)
            return
        with self.table.cond:
            s = self.table.slots[index]
            s.handle, s.started_at = handle, self.clock()
        telemetry.event("engine.started", slot=index, url=handle.url,
                        pid=handle.process.pid if handle.process else None)

    # --- generation (the one request loop: t1ops.engines.requests) ---------------------------
    def generate(self, request: P.GenerateRequest) -> P.GenerateResponse:
        """Generate on a live engine; resubmit if the engine dies or the barrier aborts the request.

        Returns a finished response sampled entirely under ``response.weight_version``.
        Raises :class:`EngineDeadError` after ``max_resubmits`` engine failures,
        :class:`EngineError` when an engine aborts the request outside a barrier, and lets
        data-contract errors (malformed/missing routing) through: those abort the rollout.
        """
        return requests.generate(self, self.cfg, self._gen_pool, request)

    def admit(self, avoid: set[int], rid: str | None = None) -> tuple[int, Ticket]:
        """Wait for an open gate and a live engine; register the request as in flight on it."""
        def pick() -> Slot | None:
            live = [s for s in self.table.slots if s.status == "live"]
            if not self.table.gate_open or not live:
                return None
            preferred = [s for s in live if s.index not in avoid] or live
            return min(preferred, key=lambda s: (len(s.in_flight), s.last_used))  # least loaded, then LRU
        with self.table.cond:
            if not self.table.cond.wait_for(lambda: pick() is not None, timeout=self.cfg.generate_timeout_s):
                raise requests.wait_for_engine_error(self.cfg.generate_timeout_s, self.table.gate_open, self.describe())
            s = pick()
            ticket_id = next(self._tickets)
            ticket = Ticket(version=self.table.version, num_syncs=self.table.num_syncs, slot=s.index, url=s.handle.url,
                            client=s.handle.client, owner=s)
            s.in_flight[ticket_id], s.last_used = ticket, ticket_id
            return ticket_id, ticket

    def call(self, t: Ticket, request: P.GenerateRequest) -> P.GenerateResponse:
        return t.client.generate(request)

    def release(self, ticket_id: int, t: Ticket) -> None:
        with self.table.cond:
            t.owner.in_flight.pop(ticket_id, None)
            self.table.cond.notify_all()

    def left_rotation(self, t: Ticket) -> str:
        return t.owner.dead_reason

    def engine_failed(self, t: Ticket, err: Exception, engine_reports_failed: bool) -> None:
        s = t.owner
        if engine_reports_failed:  # alive but failed (swallowed-engine-death): dead now
            self.table.declare_dead(s, f"engine reported itself failed: {err}"[:500])
        else:
            self.health.exited(s)  # a refused connection from a killed process: dead now, not in N pings

    def check_versions(self, t: Ticket, resp: P.GenerateResponse) -> str | None:
        if requests.response_versions_ok(resp, t.version, self.table.history, self.pause_mode):
            return None
        why = requests.missed_sync_reason(resp, t.version, self.table.version)
        self.table.declare_dead(t.owner, why)
        return why

    def syncs_since(self, t: Ticket) -> int:
        return self.table.num_syncs - t.num_syncs

    def served(self, t: Ticket, rid: str | None) -> None:
        pass  # the pool keeps no trajectory affinity (direct callers do)
