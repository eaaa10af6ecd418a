"""Bounded control plane: every control-plane HTTP call has a timeout and a retry budget.

Report, section 08: "unbounded control-plane HTTP (bounded timeouts, while
bulk weight transfers deliberately stay unbounded)". An engine that accepts
the TCP connection and never answers (SIGSTOPped, wedged in a kernel, a
half-dead load balancer) made one unbounded ``/pause_generation``-style call
hang a whole campaign: nothing failed, nothing progressed.

:class:`BoundedHttp` is a drop-in for the ``request(method, url, json=...)``
slice of ``httpx.Client`` that :class:`rl.engines.client.EngineClient` uses.
It picks a policy per endpoint path:

- **control** (health, pause, continue, abort, flush, version, and any path not
  listed below): ``timeout_s`` per attempt, at most ``attempts`` attempts with
  exponential backoff (tenacity), and an overall deadline. Exhaustion raises
  :class:`ControlPlaneTimeout` naming the endpoint, the attempt count, the
  deadline and the last error.
- **generate**: one attempt bounded by ``generate_timeout_s``; a failure raises
  :class:`EngineError` (resubmission is the engine pool's decision, because
  another engine may serve the request).
- **bulk** (``/update_weights_from_disk``): deliberately UNBOUNDED. Pushing a
  122B checkpoint takes as long as it takes, and a timeout would abort a healthy
  sync half-way; the engine's liveness during the transfer is the health
  pinger's job, not a timeout's. Every such call emits the event
  ``http.unbounded_bulk_call`` and a log line saying so.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Literal

import httpx
import tenacity

from rl.engines import protocol as P
from rl.engines import protocol_weights as PW
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.errors import ControlPlaneTimeout, EngineError, InputError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "unbounded-http": ("engine.request_timeout_s", "engine.request_attempts", "engine.retry_backoff_s", "engine.generate_timeout_s"),
}

RUNBOOK = "runbooks/unbounded-http.md"
log = logging.getLogger(__name__)

Policy = Literal["control", "generate", "bulk"]
#: Paths that are not control-plane calls; everything else is bounded as control.
NON_CONTROL: dict[str, Policy] = {P.GENERATE: "generate", P.UPDATE_WEIGHTS_FROM_DISK: "bulk",
                                  # the distributed update: the group's own timeout bounds these, and a
                                  # retried init would join the group twice (t1ops.guards.weight_sync)
                                  PW.INIT_WEIGHTS_UPDATE_GROUP: "bulk", PW.UPDATE_WEIGHTS_FROM_DISTRIBUTED: "bulk",
                                  "/weights_checksum": "bulk"}  # hashes every tensor: as long as a load


def policy_for(path: str) -> Policy:
    """The policy of an endpoint path; any path not declared generate/bulk is control (bounded)."""
    return NON_CONTROL.get(path, "control")


class BoundedHttp:
    """``httpx.Client.request``-compatible transport that bounds every control-plane call.

    ``deadline_s`` defaults to ``attempts * (timeout_s + backoff cap)``: the
    longest a control call can take before :class:`ControlPlaneTimeout`.
    """

    def __init__(self, *, timeout_s: float, attempts: int, generate_timeout_s: float,
                 backoff_s: float = 0.2, deadline_s: float | None = None,
                 client: httpx.Client | None = None) -> None:
        if timeout_s <= 0 or attempts < 1 or generate_timeout_s <= 0 or backoff_s < 0:
            raise InputError(f"BoundedHttp(timeout_s={timeout_s}, attempts={attempts}, generate_timeout_s="
                             f"{generate_timeout_s}, backoff_s={backoff_s}): timeouts must be > 0, "
                             "attempts >= 1, backoff >= 0", timeout_s=timeout_s, attempts=attempts)
        self.timeout_s, self.attempts = timeout_s, attempts
        self.generate_timeout_s, self.backoff_s = generate_timeout_s, backoff_s
        self.backoff_cap_s = max(backoff_s * 8, backoff_s)
        self.deadline_s = deadline_s if deadline_s is not None else attempts * (timeout_s + self.backoff_cap_s)
        # The client's own default timeout is never used: every call passes one explicitly.
        self.client = client or httpx.Client(timeout=timeout_s)

    @classmethod
    def from_config(cls, cfg: EngineConfig, client: httpx.Client | None = None) -> "BoundedHttp":
        return cls(timeout_s=cfg.request_timeout_s, attempts=cfg.request_attempts,
                   generate_timeout_s=cfg.generate_timeout_s, backoff_s=cfg.retry_backoff_s, client=client)

    def close(self) -> None:
        self.client.close()

    def request(self, method: str, url: str, *, json: Any = None) -> httpx.Response:
        path = httpx.URL(url).path
        policy = policy_for(path)
        if policy == "bulk":
            return self._bulk(method, url, path, json)
        if policy == "generate":
            return self._generate(method, url, path, json)
        return self._control(method, url, path, json)

    def _control(self, method: str, url: str, path: str, body: Any) -> httpx.Response:
        t0 = time.monotonic()
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts) | tenacity.stop_after_delay(self.deadline_s),
            wait=tenacity.wait_exponential(multiplier=self.backoff_s, max=self.backoff_cap_s),
            retry=tenacity.retry_if_exception_type(httpx.TransportError),
            before_sleep=lambda rs: telemetry.count("http.control.retry", endpoint=path),
            reraise=False)
        try:
            resp = retrying(self.client.request, method, url, json=body, timeout=self.timeout_s)
        except tenacity.RetryError as err:
            last = err.last_attempt.exception()
            num_attempts = err.last_attempt.attempt_number
            elapsed_s = time.monotonic() - t0
            telemetry.event("http.control_timeout", severity="error", endpoint=path, url=url,
                            attempts=num_attempts, elapsed_s=round(elapsed_s, 3), last_error=repr(last))
            raise ControlPlaneTimeout(
                f"{method} {url}: no answer after {num_attempts}/{self.attempts} attempts in {elapsed_s:.1f} s "
                f"(timeout {self.timeout_s:g} s per attempt, deadline {self.deadline_s:g} s); last error: "
                f"{type(last).__name__}: {last}. The engine accepts connections but does not answer, or is "
                f"down: check its process (SIGSTOP? wedged?) and see {RUNBOOK}",
                endpoint=path, url=url, attempts=num_attempts, max_attempts=self.attempts,
                deadline_s=self.deadline_s, timeout_s=self.timeout_s, elapsed_s=elapsed_s,
                last_error=repr(last)) from last
        telemetry.observe("http.control.latency_s", time.monotonic() - t0, endpoint=path)
        return resp

    def _generate(self, method: str, url: str, path: str, body: Any) -> httpx.Response:
        try:
            return self.client.request(method, url, json=body, timeout=self.generate_timeout_s)
        except httpx.TransportError as err:
            telemetry.count("http.generate.failed", endpoint=path, error=type(err).__name__)
            raise EngineError(f"{method} {url}: {type(err).__name__}: {err} (generate timeout "
                              f"{self.generate_timeout_s:g} s, one attempt; the engine pool resubmits)",
                              url=url, endpoint=path, error=type(err).__name__,
                              timeout_s=self.generate_timeout_s) from err

    def _bulk(self, method: str, url: str, path: str, body: Any) -> httpx.Response:
        # Deliberately unbounded (report, section 08): a bulk weight transfer must not be
        # cut short by a control-plane timeout; the health pinger watches the engine meanwhile.
        telemetry.event("http.unbounded_bulk_call", endpoint=path, url=url)
        log.info("%s %s: bulk weight transfer, deliberately without a timeout", method, url)
        t0 = time.monotonic()
        resp = self.client.request(method, url, json=body, timeout=None)
        telemetry.observe("http.bulk.duration_s", time.monotonic() - t0, endpoint=path)
        return resp
