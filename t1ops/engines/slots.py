"""What the engine pool holds: a started engine's handle, its slot, the requests in flight on it.

Also how engines start (:func:`spawn_factory` for processes the pool owns, :func:`url_factory`
for external SGLang servers) and how an owned one is killed (:func:`kill_engine`). The pool
and its contract: :class:`t1ops.engines.pool.EnginePool`.
"""
from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import httpx

from rl.engines.client import EngineClient
from rl.engines.ports import PORT_TAKEN_EXIT, free_port
from t1ops import telemetry
from t1ops.errors import ControlPlaneTimeout, EngineError, InputError

RUNBOOK = "runbooks/dead-engine.md"
#: Errors that mean "this engine failed the call" (as opposed to bad data).
ENGINE_FAILURES = (EngineError, ControlPlaneTimeout, httpx.TransportError)
Status = Literal["starting", "live", "dead"]


def reports_failed(err: BaseException) -> bool:
    """The engine answered 503: its process lives but it cannot serve (a background loop died,
    rl.engines.background; SGLang answers 503 when unhealthy): dead now, not in N pings."""
    return isinstance(err, EngineError) and getattr(err, "context", {}).get("status_code") == 503


@dataclass
class EngineHandle:
    """A started engine: its client and, when the pool owns it, its process."""

    url: str
    client: EngineClient
    process: subprocess.Popen | None = None


EngineFactory = Callable[[int], EngineHandle]  # slot -> a freshly started engine (may still be compiling)


@dataclass
class Ticket:
    """One request in flight on one engine; ``wake`` is set when it finishes or its engine dies."""

    version: str
    num_syncs: int  # barriers begun before admission: a later one explains an abort
    slot: int = -1  # the engine it runs on (index, url, client)
    url: str = ""
    client: Any = None
    owner: Any = None  # the pool's Slot object (a recreated engine's slot is a new one)
    wake: threading.Event = field(default_factory=threading.Event)


@dataclass
class Slot:
    """One place in the pool: the engine now in it, its health, and the requests in flight on it."""

    index: int
    handle: EngineHandle | None  # None while the factory is still starting the engine
    started_at: float
    status: Status = "starting"
    consecutive_failures: int = 0
    ping_pending: bool = False
    last_used: int = -1
    dead_reason: str = ""
    awaiting_weights: bool = False  # healthy, at another version; the next barrier brings it in
    in_flight: dict[int, Ticket] = field(default_factory=dict)



PORT_ATTEMPTS = 3


@dataclass
class SlotTable:
    """The pool's engines and weight state: the one table the pool, its Health and its Barrier share.

    ``cond`` guards every field and is notified on every change that a waiter may want;
    ``sync_lock`` serialises barriers and admissions (no admission interleaves with a barrier).
    """

    version: str  # the weight version every live engine serves
    checkpoint_dir: str | None  # where that version's weights are (loaded into a starting engine)
    admit_source: str | None = None  # what an engine admitted alone loads (disk sync: the trainer's export)
    slots: list[Slot] = field(default_factory=list)
    history: list[str] = field(default_factory=list)  # every version published, oldest first
    gate_open: bool = True  # False while a barrier holds new requests back
    syncing: bool = False
    num_syncs: int = 0  # barriers begun: one begun since a request's admission explains its abort
    cond: threading.Condition = field(default_factory=threading.Condition)
    sync_lock: threading.Lock = field(default_factory=threading.Lock)
    clock: Callable[[], float] = time.monotonic  # injectable for tests (monotonic seconds)

    def __post_init__(self) -> None:
        self.history = self.history or [self.version]

    def live_slots(self) -> list[int]:
        return [s.index for s in self.slots if s.status == "live"]

    def describe(self) -> str:
        return ", ".join(f"engine {s.index} {s.status}" + (f" ({s.dead_reason})" if s.dead_reason else "")
                         for s in self.slots)

    def declare_dead(self, s: Slot, reason: str) -> None:
        """Take ``s`` out of rotation, kill its process, wake its requests in flight (they resubmit)."""
        with self.cond:
            if s.status == "dead":
                return
            s.status, s.dead_reason = "dead", reason
            tickets = list(s.in_flight.values())
            self.cond.notify_all()
        for t in tickets:
            t.wake.set()  # callers abandon the call and resubmit
        kill_engine(s.handle.process if s.handle else None)
        telemetry.count("engine.dead", slot=s.index)
        telemetry.gauge("engine.live", len(self.live_slots()))
        telemetry.event("engine.dead", severity="error", slot=s.index, url=s.handle.url if s.handle else None,
                        reason=reason,
                        num_in_flight=len(tickets), age_s=round(self.clock() - s.started_at, 3))


def spawn_factory(spawn: Callable[[int], subprocess.Popen], http: Any, *, host: str = "127.0.0.1",
                  **client_kw: Any) -> EngineFactory:
    """Factory starting each engine as ``spawn(port)`` on a fresh loopback port.

    ``http`` is the transport shared by the clients (a ``BoundedHttp`` when guarded);
    ``client_kw`` goes to :class:`EngineClient` (``num_moe_layers``, ``topk``, ``num_experts``).
    """
    def make(slot: int) -> EngineHandle:
        for attempt in range(PORT_ATTEMPTS):   # free_port races other binders (two campaigns on a host)
            port = free_port(host)
            try:
                process = spawn(port)
            except EngineError as e:
                if e.context.get("returncode") != PORT_TAKEN_EXIT or attempt == PORT_ATTEMPTS - 1:
                    raise
                telemetry.event("engine.port_taken", severity="warning", slot=slot, port=port)
                continue
            url = f"http://{host}:{port}"
            return EngineHandle(url=url, client=EngineClient(url, http, **client_kw), process=process)
        raise AssertionError("unreachable")
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


def kill_engine(proc: subprocess.Popen | None) -> None:
    """SIGKILL an owned engine process (it may be hung or stopped) and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        telemetry.event("engine.kill_unreaped", severity="error", pid=proc.pid)

