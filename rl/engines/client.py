"""A synchronous client for one SGLang(-compatible) engine.

The HTTP client is injected: anything with httpx's ``request(method, url,
json=...)`` returning an object with ``status_code``, ``text`` and ``json()``.
A plain ``httpx.Client`` works (unbounded or with its own timeout);
``t1ops.guards.http.BoundedHttp`` adds per-endpoint timeouts and bounded
retries. ``rl`` never imports ``t1ops``, so the policy lives with the caller.

Transport errors (connection refused, timeouts) propagate unchanged from the
injected client; an answer with a bad status or body raises
:class:`~rl.errors.EngineError` or :class:`~rl.errors.ParseError`.
"""
from __future__ import annotations

from typing import Any, Protocol

from rl.engines import protocol as P
from rl.engines import protocol_control as PC
from rl.engines import protocol_weights as PW
from rl.errors import EngineError, ParseError


class HttpResponse(Protocol):
    status_code: int
    text: str

    def json(self) -> Any:
        """The decoded JSON body (raises ValueError when the body is not JSON)."""


class HttpClient(Protocol):
    """The slice of ``httpx.Client`` the engine client uses."""

    def request(self, method: str, url: str, *, json: Any = None) -> HttpResponse:
        """Send one request; raise the transport's error on connection failure or timeout."""


class EngineClient:
    """Generate and control calls against one engine at ``base_url``.

    ``num_moe_layers``/``topk``/``num_experts`` describe the served model so
    that routing rows can be checked; they are required only for requests with
    ``return_routed_experts``.
    """

    def __init__(self, base_url: str, http: HttpClient, *, num_moe_layers: int | None = None,
                 topk: int | None = None, num_experts: int | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = http
        self.num_moe_layers, self.topk, self.num_experts = num_moe_layers, topk, num_experts

    def __repr__(self) -> str:
        return f"EngineClient({self.base_url!r})"

    def _call(self, method: str, path: str, body: Any = None) -> HttpResponse:
        return self.http.request(method, self.base_url + path, json=body)

    def _json(self, resp: HttpResponse, path: str, ok: tuple[int, ...] = (200,)) -> Any:
        if resp.status_code not in ok:
            raise EngineError(f"{self.base_url}{path}: HTTP {resp.status_code}: {resp.text[:300]}",
                              url=self.base_url, endpoint=path, status_code=resp.status_code)
        try:
            return resp.json()
        except ValueError as err:
            raise ParseError(f"{self.base_url}{path}: response is not JSON ({err}): {resp.text[:200]!r}",
                             url=self.base_url, endpoint=path) from err

    # --- generation ---------------------------------------------------------------
    def generate(self, request: P.GenerateRequest) -> P.GenerateResponse:
        """``POST /generate``; the response is validated against ``request``.

        An aborted request (paused for a weight sync, or ``/abort_request``) is
        returned with ``finish_reason.type == "abort"``: resubmit it, never train on it.
        """
        resp = self._call("POST", P.GENERATE, request.to_json())
        return P.parse_generate_response(self._json(resp, P.GENERATE), request,
                                         num_moe_layers=self.num_moe_layers, topk=self.topk,
                                         num_experts=self.num_experts)

    # --- health ----------------------------------------------------------------------
    def health(self) -> bool:
        """``GET /health``: the server process answers (200) or is starting/unhealthy (503)."""
        return PC.ok_status(self._call("GET", P.HEALTH).status_code)

    def health_generate(self) -> bool:
        """``GET /health_generate``: the server can still run a one-token generation."""
        return PC.ok_status(self._call("GET", P.HEALTH_GENERATE).status_code)

    # --- control -------------------------------------------------------------------
    def pause_generation(self, mode: PC.PauseMode = "abort") -> None:
        """``POST /pause_generation``; ``abort`` returns every in-flight request as aborted."""
        self._json(self._call("POST", P.PAUSE_GENERATION, PC.PauseGenerationRequest(mode).to_json()),
                   P.PAUSE_GENERATION)

    def continue_generation(self) -> None:
        """``POST /continue_generation``."""
        self._json(self._call("POST", P.CONTINUE_GENERATION, PC.ContinueGenerationRequest().to_json()),
                   P.CONTINUE_GENERATION)

    def abort_request(self, rid: str = "", *, abort_all: bool = False) -> None:
        """``POST /abort_request`` for one ``rid`` or, with ``abort_all``, every request."""
        resp = self._call("POST", P.ABORT_REQUEST, PC.AbortRequest(rid=rid, abort_all=abort_all).to_json())
        if resp.status_code != 200:
            raise EngineError(f"{self.base_url}{P.ABORT_REQUEST}: HTTP {resp.status_code}: {resp.text[:300]}",
                              url=self.base_url, endpoint=P.ABORT_REQUEST, status_code=resp.status_code)

    def flush_cache(self) -> bool:
        """``POST /flush_cache``; False when the engine refused (requests still running)."""
        return PC.ok_status(self._call("POST", P.FLUSH_CACHE).status_code)

    def weight_version(self) -> str:
        """The engine's current weight version (``GET /model_info``)."""
        return PC.ModelInfo.from_json(self._json(self._call("GET", P.MODEL_INFO), P.MODEL_INFO)).weight_version

    def cache_stats(self) -> dict:
        """The engine's K/V cache use from ``GET /model_info``: ``kv_cache_usage``, ``kv_cache_peak`` (since
        the current weights loaded) and ``kv_cache_slots`` (rl.engines.batching); {} from an engine that does
        not report them (a stock SGLang server exports its token usage as a Prometheus metric instead)."""
        info = self._json(self._call("GET", P.MODEL_INFO), P.MODEL_INFO)
        return {k: info[k] for k in ("kv_cache_usage", "kv_cache_peak", "kv_cache_slots") if k in info}

    def weight_checksums(self, dtype: str) -> dict:
        """``POST /weights_checksum`` (t1ops; rl.engines.weight_updates): ``{"weight_version", "dtype",
        "tensors": {name: checksum}}`` computed by the engine from the tensors it holds now. An engine
        without the endpoint (a stock SGLang server) raises :class:`EngineError` with status 404."""
        return self._json(self._call("POST", "/weights_checksum", {"dtype": dtype}), "/weights_checksum")

    def update_weight_version(self, new_version: str, *, abort_all_requests: bool = True) -> None:
        """``POST /update_weight_version``: relabel the current weights (no transfer)."""
        body = PC.UpdateWeightVersionRequest(new_version, abort_all_requests).to_json()
        self._json(self._call("POST", P.UPDATE_WEIGHT_VERSION, body), P.UPDATE_WEIGHT_VERSION)

    def update_weights_from_disk(self, model_path: str, weight_version: str) -> PC.UpdateWeightsFromDiskResponse:
        """``POST /update_weights_from_disk``: load ``model_path`` and report ``weight_version``.

        A refusal (``success: false``, HTTP 400) raises :class:`EngineError`
        carrying the engine's message.
        """
        body = PC.UpdateWeightsFromDiskRequest(model_path=model_path, weight_version=weight_version).to_json()
        resp = self._call("POST", P.UPDATE_WEIGHTS_FROM_DISK, body)
        # SGLang answers a refusal with HTTP 400 and the same JSON body as a success.
        out = PC.UpdateWeightsFromDiskResponse.from_json(self._json(resp, P.UPDATE_WEIGHTS_FROM_DISK, (200, 400)))
        if not out.success:
            raise EngineError(f"{self.base_url}: weight update from {model_path} refused: {out.message}",
                              url=self.base_url, model_path=model_path, weight_version=weight_version)
        return out

    # --- distributed weight updates (rl.engines.protocol_weights) ---------------------------
    def _weights_call(self, path: str, body: dict) -> "PW.WeightsResponse":
        resp = self._call("POST", path, body)
        out = PW.WeightsResponse.from_json(self._json(resp, path, (200, 400)))
        if not out.success:
            raise EngineError(f"{self.base_url}{path} refused: {out.message}", url=self.base_url, endpoint=path)
        return out

    def init_weights_update_group(self, request: "PW.InitWeightsUpdateGroupRequest") -> "PW.WeightsResponse":
        """``POST /init_weights_update_group``; returns once the engine joined (the trainer must join too)."""
        return self._weights_call(PW.INIT_WEIGHTS_UPDATE_GROUP, request.to_json())

    def update_weights_from_distributed(self, request: "PW.UpdateWeightsFromDistributedRequest") -> "PW.WeightsResponse":
        """``POST /update_weights_from_distributed``; returns once the engine received and loaded the tensors."""
        return self._weights_call(PW.UPDATE_WEIGHTS_FROM_DISTRIBUTED, request.to_json())

    def destroy_weights_update_group(self, group_name: str) -> "PW.WeightsResponse":
        """``POST /destroy_weights_update_group``."""
        return self._weights_call(PW.DESTROY_WEIGHTS_UPDATE_GROUP,
                                  PW.DestroyWeightsUpdateGroupRequest(group_name).to_json())
