"""Rollout workers call engines directly; the router only hands out membership and health.

Before, every ``/generate`` of every worker went through one router actor (a
Ray call that re-sent the whole ``input_ids`` per turn): one actor on the
per-token path. Now a worker holds a :class:`DirectEngines`: it reads the
pool's *view* (engine addresses, live/dead, weight version, the sync gate,
the number of barriers begun) from the router every ``refresh_s`` (one small
control-plane call per worker, never per request) and sends each request
straight to an engine over the guarded HTTP client (:class:`BoundedHttp`).

The guard contract is :class:`~t1ops.engines.pool.EnginePool`'s, unchanged
(docs/engine.md): requests wait while the gate is closed or no engine is live
(up to ``generate_timeout_s``); the least-loaded live engine takes a request;
a request whose engine the view shows dead (pings, exited process) is
abandoned at once and resubmitted, up to ``max_resubmits`` engine failures,
then :class:`EngineDeadError`; an abort that a barrier begun since admission
explains is resubmitted, any other abort raises; a response under an
unpublished version, or spanning two, takes its engine out of rotation and is
resubmitted. A trajectory's next turn goes to the engine that served its
previous turn (its K/V prefix is there) unless that engine carries more than
``AFFINITY_SLACK`` more of this worker's requests than the least loaded one.
Failures are reported to the pool (``report_failure``, a call that returns once the pool has
judged) and a resubmit reads a fresh view before it picks; the pool
owns the processes: it declares an exited process or a wrong-version engine
dead, kills it, and recreates it at the next weight sync.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import itertools
import threading
import time
from typing import Any, Callable

from rl.engines import protocol as P
from rl.engines.client import EngineClient
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines import requests
from t1ops.engines.slots import Ticket

AFFINITY_ENTRIES = 4096   # trajectories whose last engine is remembered (LRU)
AFFINITY_SLACK = 2        # a trajectory stays on its engine while it has at most this many more requests
ViewFn = Callable[[], dict]                  # EnginePool.view() through the router
ReportFn = Callable[..., Any]               # EnginePool.report_failure(index, url, reason, wrong_version=)


class DirectEngines:
    """``generate(request)`` straight to the engines, guarded as the module docstring says."""

    def __init__(self, fetch_view: ViewFn, report: ReportFn, cfg: EngineConfig, *,
                 make_client: Callable[[str], EngineClient], refresh_s: float = 0.25,
                 max_concurrency: int = 64) -> None:
        self.fetch_view, self.report, self.cfg = fetch_view, report, cfg
        self.make_client, self.refresh_s = make_client, refresh_s
        self._clients: dict[str, EngineClient] = {}
        self._cond = threading.Condition()
        self._view = fetch_view()
        self._tickets: dict[int, Ticket] = {}
        self._affinity: collections.OrderedDict[str, tuple[int, str]] = collections.OrderedDict()
        self._ids = itertools.count()
        self._pool = cf.ThreadPoolExecutor(max_concurrency, thread_name_prefix="direct-gen")
        self._stop = threading.Event()
        self._refresher = threading.Thread(target=self._refresh_loop, name="engine-view", daemon=True)
        self._refresher.start()

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- membership -------------------------------------------------------------------
    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self._refresh_quietly()

    def refresh(self) -> None:
        """Fetch the pool's view; wake requests whose engine left rotation."""
        view = self.fetch_view()
        live = {(i, url) for i, url, status in view["engines"] if status == "live"}
        with self._cond:
            self._view = view
            for t in self._tickets.values():
                if (t.slot, t.url) not in live:
                    t.wake.set()  # abandon and resubmit, as the pool does for a dead engine
            self._cond.notify_all()

    def _refresh_quietly(self) -> None:
        """:meth:`refresh`, or the last view kept and a warning when the router is busy or gone. The
        refresher calls it, and so does a resubmit: a view up to ``refresh_s`` old still shows the engine
        that just failed as live, and the loop spent every resubmit on it in milliseconds (the seeded
        schedule's lost step, docs/testing.md "Flakes")."""
        try:
            self.refresh()
        except Exception as err:  # keep the last view, say so
            telemetry.event("engine.view_refresh_failed", severity="warning", error=repr(err)[:200])

    def _report(self, *args, **kw) -> None:
        """Tell the pool (it owns the processes); returns once it has judged, so the next view shows it."""
        try:
            self.report(*args, **kw)
        except Exception as err:  # the router is busy or gone: the pinger still judges the engine
            telemetry.event("engine.report_failed", severity="warning", slot=args[0], error=repr(err)[:200])

    def _live(self) -> list[tuple[int, str]]:
        return [(i, url) for i, url, status in self._view["engines"] if status == "live"]

    def _client(self, url: str) -> EngineClient:
        if url not in self._clients:
            self._clients[url] = self.make_client(url)
        return self._clients[url]

    # --- generation (the one request loop: t1ops.engines.requests) ---------------------------
    def generate(self, request: P.GenerateRequest) -> P.GenerateResponse:
        return requests.generate(self, self.cfg, self._pool, request)

    def admit(self, avoid: set[int], rid: str | None = None) -> tuple[int, Ticket]:
        """Wait for an open gate and a live engine; pick the least loaded (from this worker's view),
        or the engine of the trajectory's previous turn (its K/V prefix) while it is not much busier."""
        previous = self._affinity.get(_trajectory_key(rid))
        if avoid:  # a resubmit: the pool has judged the engine that failed it (report_failure); read its verdict
            self._refresh_quietly()
        deadline = time.monotonic() + self.cfg.generate_timeout_s
        with self._cond:
            while not (self._view["gate_open"] and self._live()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise requests.wait_for_engine_error(self.cfg.generate_timeout_s, self._view["gate_open"],
                                                         self.describe())
                self._cond.wait(timeout=min(left, self.refresh_s))
            live = self._live()
            preferred = [e for e in live if e[0] not in avoid] or live
            load = {e: sum(1 for t in self._tickets.values() if (t.slot, t.url) == e) for e in preferred}
            slot, url = min(preferred, key=lambda e: load[e])
            if previous in load and load[previous] <= load[(slot, url)] + AFFINITY_SLACK:
                slot, url = previous
            ticket_id = next(self._ids)
            t = Ticket(version=self._view["version"], num_syncs=self._view["num_syncs"], slot=slot, url=url,
                       client=self._client(url))
            self._tickets[ticket_id] = t
            return ticket_id, t

    def call(self, t: Ticket, request: P.GenerateRequest) -> P.GenerateResponse:
        return t.client.generate(request)

    def release(self, ticket_id: int, t: Ticket) -> None:
        with self._cond:
            self._tickets.pop(ticket_id, None)

    def left_rotation(self, t: Ticket) -> str:
        return "the pool's view shows it out of rotation"

    def engine_failed(self, t: Ticket, err: Exception, engine_reports_failed: bool) -> None:
        """The pool owns the process: it declares an exited or self-reported failed engine dead."""
        why = f"{type(err).__name__}: {err}"[:300]
        self._report(t.slot, t.url, why, engine_failed=engine_reports_failed)

    def check_versions(self, t: Ticket, resp: P.GenerateResponse) -> str | None:
        if _versions_ok_in(self._view, t.version, resp):
            return None
        self.refresh()  # the view may predate the sync that explains the response
        if _versions_ok_in(self._view, t.version, resp):
            return None
        why = requests.missed_sync_reason(resp, t.version, self._view["version"])
        self._report(t.slot, t.url, why, wrong_version=True)
        return why

    def syncs_since(self, t: Ticket) -> int:
        self.refresh()  # an abort: the barrier that explains it may be newer than the view
        return self._view["num_syncs"] - t.num_syncs

    def served(self, t: Ticket, rid: str | None) -> None:
        key = _trajectory_key(rid)
        if key is None:
            return
        with self._cond:
            self._affinity[key] = (t.slot, t.url)
            self._affinity.move_to_end(key)
            while len(self._affinity) > AFFINITY_ENTRIES:
                self._affinity.popitem(last=False)

    def describe(self) -> str:
        return str(self._view["engines"])


def _versions_ok_in(view: dict, admitted: str, resp: P.GenerateResponse) -> bool:
    """The pool's rule (``response_versions_ok``): in-place pauses (fully async) let a response span the
    versions published since admission; abort pauses allow one version, the admitted or the current."""
    history = list(view.get("history") or [])
    if not history or history[-1] != view["version"]:  # a view taken between the two assignments
        history.append(view["version"])
    return requests.response_versions_ok(resp, admitted, history, view.get("pause_mode", "abort"))


def _trajectory_key(rid: str | None) -> str | None:
    """``sample-t3`` -> ``sample``: the agent loop names a trajectory's turns ``<sample_id>-t<turn>``."""
    if not rid or "-t" not in rid:
        return None
    head, _, turn = rid.rpartition("-t")
    return head if turn.isdigit() else None
