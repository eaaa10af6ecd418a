"""The embedded engine's HTTP server: SGLang's endpoints in front of an :class:`EmbeddedEngine`.

Endpoints: ``POST /generate``, ``GET /health``, ``GET /health_generate``,
``POST /pause_generation``, ``POST /continue_generation``,
``POST /update_weights_from_disk``, ``POST /update_weight_version``,
``POST /abort_request``, ``POST /flush_cache``, ``GET /model_info`` and
``GET /get_weight_version``, plus the distributed weight-update routes of
:mod:`rl.engines.weight_updates` and any added with :func:`route`. A data-contract error
(:class:`~rl.errors.T1OpsError`) answers 400 with its message; an engine whose background
loop died (:class:`~rl.engines.background.EngineFailedError`) answers 503, ``/health``
included; anything else answers 500 and the server keeps serving.
"""
from __future__ import annotations

import json
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable

from rl.engines import protocol as P
from rl.engines import protocol_control as PC
from rl.engines import weight_updates
from rl.engines.background import EngineFailedError
from rl.engines.embedded_engine import EmbeddedEngine
from rl.errors import CheckpointError, InputError, ParseError, T1OpsError


#: Endpoints added by other modules: ``(method, path) -> fn(engine, read_body) -> (status, json)``;
#: ``read_body()`` parses the request's JSON body. Register with :func:`route` at import time.
EXTRA_ROUTES: dict[tuple[str, str], Callable[[Any, Callable[[], Any]], tuple[int, Any]]] = {}


def route(method: str, path: str):
    """Decorator adding an endpoint to every engine server, e.g.
    ``@route("POST", "/update_weights_from_tensor") def _update(engine, read_body): ...``."""
    def register(fn):
        EXTRA_ROUTES[(method.upper(), path)] = fn
        return fn
    return register


def make_handler(engine: EmbeddedEngine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
            return  # one line per request would drown the campaign log

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError as exc:
                raise ParseError(f"bad Content-Length header: {exc}") from exc
            if length < 0:
                raise ParseError(f"bad Content-Length header: {length}")
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw) if raw else {}
            except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, absurdly nested
                raise ParseError(f"request body is not JSON: {exc}") from exc

        def _dispatch(self, routes: dict[str, Callable[[], tuple[int, Any]]]) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                self._send(HTTPStatus.NOT_FOUND, {"error": {"message": f"no route {self.command} {self.path}"}})
                return
            try:
                status, body = route()
            except EngineFailedError as exc:  # the process answers, the engine cannot: callers must see it
                status, body = HTTPStatus.SERVICE_UNAVAILABLE, {"error": {"message": str(exc), "type": "EngineFailed"}}
            except T1OpsError as exc:
                status, body = HTTPStatus.BAD_REQUEST, {"error": {"message": str(exc), "type": type(exc).__name__}}
            except Exception as exc:  # a server answers 500 and keeps serving; the traceback goes to its log
                traceback.print_exc()
                status, body = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {"message": repr(exc)}}
            self._send(status, body)

        def _extra(self, method: str) -> dict[str, Callable[[], tuple[int, Any]]]:
            return {path: (lambda fn=fn: fn(engine, self._body)) for (m, path), fn in EXTRA_ROUTES.items()
                    if m == method}

        def do_GET(self) -> None:  # noqa: N802 (stdlib name)
            self._dispatch({
                **self._extra("GET"),
                P.HEALTH: lambda: _health(engine),
                P.HEALTH_GENERATE: lambda: _health_generate(engine),
                P.MODEL_INFO: lambda: (HTTPStatus.OK, _model_info(engine)),
                "/get_weight_version": lambda: (HTTPStatus.OK, {"weight_version": engine.weight_version}),
            })

        def do_POST(self) -> None:  # noqa: N802 (stdlib name)
            self._dispatch({
                **self._extra("POST"),
                P.GENERATE: lambda: (HTTPStatus.OK, engine.generate(P.GenerateRequest.from_json(self._body())).to_json()),
                P.PAUSE_GENERATION: lambda: _ok(engine.pause(PC.PauseGenerationRequest.from_json(self._body()).mode)),
                P.CONTINUE_GENERATION: lambda: _continue(engine, self._body()),
                P.ABORT_REQUEST: lambda: _abort(engine, PC.AbortRequest.from_json(self._body())),
                P.FLUSH_CACHE: lambda: _flush(engine),
                P.UPDATE_WEIGHTS_FROM_DISK: lambda: _update_weights(engine, self._body()),
                P.UPDATE_WEIGHT_VERSION: lambda: _update_version(engine, self._body()),
                P.HEALTH_GENERATE: lambda: _health_generate(engine),
                **weight_updates.routes(engine, self._body),  # /init_weights_update_group & co.
            })

    return Handler


def _ok(_: Any = None) -> tuple[int, Any]:
    return HTTPStatus.OK, {"success": True}


def _continue(engine: EmbeddedEngine, body: Any) -> tuple[int, Any]:
    PC.ContinueGenerationRequest.from_json(body)  # validates; torch_empty_cache has no CPU meaning
    engine.resume()
    return _ok()


def _health(engine: EmbeddedEngine) -> tuple[int, Any]:
    if engine.failed is not None:
        raise EngineFailedError(f"engine failed: {engine.failed}")
    return HTTPStatus.OK, {}


def _health_generate(engine: EmbeddedEngine) -> tuple[int, Any]:
    engine.health_generate()
    return HTTPStatus.OK, {}


def _model_info(engine: EmbeddedEngine) -> dict:
    info = PC.ModelInfo(weight_version=engine.weight_version, model_path=engine.model_path).to_json()
    info.update(spec=engine.spec.to_dict(), dtype=str(engine.dtype).removeprefix("torch."), engine="embedded",
                num_running_requests=engine.num_running(), is_paused=engine.paused,
                num_generated_tokens=engine.num_generated_tokens,
                **(engine.scheduler.cache_stats() if engine.scheduler is not None else {}))
    return info


def _abort(engine: EmbeddedEngine, request: PC.AbortRequest) -> tuple[int, Any]:
    return HTTPStatus.OK, {"success": True, "num_aborted": engine.abort(request.rid, request.abort_all)}


def _flush(engine: EmbeddedEngine) -> tuple[int, Any]:
    # SGLang refuses to flush while requests run (HTTP 400); the retained prefixes are the cache.
    if engine.num_running():
        return HTTPStatus.BAD_REQUEST, {"message": "Cache not flushed: requests are running"}
    if engine.scheduler is not None:
        engine.scheduler.flush()
    return HTTPStatus.OK, {"message": "Cache flushed"}


def _update_weights(engine: EmbeddedEngine, body: Any) -> tuple[int, Any]:
    request = PC.UpdateWeightsFromDiskRequest.from_json(body)
    try:
        engine.update_weights(request)
    except (CheckpointError, InputError) as exc:
        return HTTPStatus.BAD_REQUEST, PC.UpdateWeightsFromDiskResponse(False, str(exc)).to_json()
    message = f"loaded {request.model_path} as weight version {engine.weight_version}"
    return HTTPStatus.OK, PC.UpdateWeightsFromDiskResponse(True, message).to_json()


def _update_version(engine: EmbeddedEngine, body: Any) -> tuple[int, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("new_version"), str):
        raise ParseError("update_weight_version: body needs a string 'new_version'", field="new_version")
    engine.set_version(body["new_version"], bool(body.get("abort_all_requests", False)))
    return HTTPStatus.OK, {"success": True, "message": f"weight version set to {body['new_version']}"}
