"""The one engine request loop, shared by the pool and by workers' direct traffic (docs/engine.md).

:class:`~t1ops.engines.pool.EnginePool` (through the router) and
:class:`~t1ops.engines.direct.DirectEngines` (rollout workers, straight to the engines) differ
only in where they learn which engines are live (the pool's own slots table, or a view of it)
and in how they report a failure (declare the slot dead, or tell the pool). The rules are one:

- a request waits for an open gate and a live engine, up to ``generate_timeout_s``;
- an abort that a barrier begun since admission explains is resubmitted (not a failure); any
  other abort raises :class:`EngineError`;
- an engine failure (death, a refused connection, a response under an unpublished version) is
  resubmitted to another engine, up to ``max_resubmits`` failures, then :class:`EngineDeadError`;
- a finished response under versions the pool did not publish for it (:func:`response_versions_ok`)
  takes its engine out of rotation.
"""
from __future__ import annotations

import concurrent.futures as cf
from typing import Protocol, Sequence

from rl.engines import protocol as P
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.slots import ENGINE_FAILURES, RUNBOOK, Ticket, reports_failed
from t1ops.errors import EngineDeadError, EngineError

# The failure ids of docs/failures.md this guard catches (`t1ops explain ID`): an abort a barrier
# explains resubmits the original request (its prompt, its budget); a partial is never continued.
CATCHES = {
    "resumed-partial-overshoot": ("engine.max_resubmits",),
}


class Traffic(Protocol):
    """Where the loop sends requests: the pool itself, or a worker's direct view of it."""

    def admit(self, avoid: set[int], rid: str | None) -> tuple[int, Ticket]: ...
    def call(self, ticket: Ticket, request: P.GenerateRequest) -> P.GenerateResponse: ...
    def release(self, ticket_id: int, ticket: Ticket) -> None: ...
    def left_rotation(self, ticket: Ticket) -> str: ...
    def engine_failed(self, ticket: Ticket, err: Exception, engine_reports_failed: bool) -> None: ...
    def check_versions(self, ticket: Ticket, resp: P.GenerateResponse) -> str | None: ...
    def syncs_since(self, ticket: Ticket) -> int: ...
    def served(self, ticket: Ticket, rid: str | None) -> None: ...
    def describe(self) -> str: ...


def generate(traffic: Traffic, cfg: EngineConfig, executor: cf.Executor,
             request: P.GenerateRequest) -> P.GenerateResponse:
    """Generate on a live engine of ``traffic`` under the module's rules; returns a finished response
    sampled under versions the pool published for it. Data-contract errors (malformed/missing routing)
    pass through: those abort the rollout."""
    num_failures, avoid = 0, set()
    while True:
        ticket_id, t = traffic.admit(avoid, request.rid)
        outcome = _run_once(traffic, executor, ticket_id, t, request)
        if isinstance(outcome, P.GenerateResponse):
            if not outcome.finish_reason.is_abort:
                traffic.served(t, request.rid)
                return outcome
            if traffic.syncs_since(t) == 0:  # no barrier explains it: the engine refused it
                telemetry.count("engine.request_failed", reason="aborted_by_engine")
                raise EngineError(f"engine {t.slot} aborted request {request.rid!r} outside a weight sync: "
                                  f"{outcome.finish_reason.message} (status {outcome.finish_reason.status_code})"
                                  "; not resubmitted", rid=request.rid, slot=t.slot)
            telemetry.count("engine.request_resubmitted", reason="aborted_by_pause")
            continue  # the barrier paused it: wait for the gate, resubmit; not a failure
        num_failures += 1
        avoid = {t.slot}
        if num_failures > cfg.max_resubmits:
            telemetry.count("engine.request_failed")
            raise EngineDeadError(f"request {request.rid!r} failed on {num_failures} engines (max_resubmits "
                                  f"{cfg.max_resubmits}); last: engine {t.slot}: {outcome}; engines: "
                                  f"{traffic.describe()}. See {RUNBOOK}", rid=request.rid, num_failures=num_failures)
        telemetry.count("engine.request_resubmitted", reason="engine_failed")
        telemetry.event("engine.request_resubmitted", severity="warning", slot=t.slot, rid=request.rid,
                        reason=str(outcome)[:200], attempt=num_failures)


def _run_once(traffic: Traffic, executor: cf.Executor, ticket_id: int, t: Ticket,
              request: P.GenerateRequest) -> P.GenerateResponse | str:
    """Run on the ticket's engine; return the response, or a string saying why the engine failed."""
    fut = executor.submit(traffic.call, t, request)
    fut.add_done_callback(lambda _f: t.wake.set())
    try:
        t.wake.wait()
        if not fut.done():
            return f"engine {t.slot} left rotation with the request in flight ({traffic.left_rotation(t)})"
        try:
            resp = fut.result()
        except ENGINE_FAILURES as e:  # an exited process or an engine that reports itself failed
            traffic.engine_failed(t, e, reports_failed(e))
            return f"{type(e).__name__}: {e}"
        if not resp.finish_reason.is_abort:
            why = traffic.check_versions(t, resp)
            if why is not None:
                return f"version mismatch on engine {t.slot}: {why}"
        return resp
    finally:
        traffic.release(ticket_id, t)


def wait_for_engine_error(timeout_s: float, gate_open: bool, engines: str) -> EngineDeadError:
    """The error of a request that found no live engine (or a closed gate) for ``timeout_s``."""
    return EngineDeadError(f"no live engine for {timeout_s:g} s (gate {'open' if gate_open else 'closed'}): "
                           f"{engines}; dead engines are recreated at the next weight sync. See {RUNBOOK}")


def response_versions_ok(resp: P.GenerateResponse, admitted, history: Sequence, pause_mode: str = "abort") -> bool:
    """Whether a finished response was sampled only under versions the pool published for it.

    ``admitted``: the pool's version when the request was admitted; ``history``: every version the
    pool published, oldest first (the last is the current one). ``abort`` pause: one version, the
    admitted or the current one. ``in_place`` (fully async): the spans name versions published since
    admission, in publication order, ending at ``resp.weight_version``.
    """
    if pause_mode == "abort":
        return resp.weight_version in (admitted, history[-1]) and not resp.spans_versions
    since = list(history[list(history).index(admitted):]) if admitted in history else []
    seen = [sp.version for sp in resp.weight_versions] or [resp.weight_version]
    positions = [since.index(v) if v in since else -1 for v in seen]
    return min(positions) >= 0 and positions == sorted(positions) and seen[-1] == resp.weight_version


def missed_sync_reason(resp: P.GenerateResponse, admitted, current) -> str:
    """Why a response that fails :func:`response_versions_ok` takes its engine out of rotation."""
    return (f"answered with weight version {resp.weight_version!r} (spans "
            f"{[v.version for v in resp.weight_versions]}) for a request admitted under "
            f"{admitted!r} (pool now {current!r}): it missed a weight sync")

