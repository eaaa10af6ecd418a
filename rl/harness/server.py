"""``/v1/chat/completions`` over HTTP (a TCP port or a unix socket), one session per trial.

Routes: ``POST /v1/chat/completions`` and ``GET /v1/models``, also under a
per-session prefix ``/s/<session>/v1/...`` (the base URL a trial's harness
gets), and ``GET /health``. A request finds its session by, in order: the
path prefix, the API key (``Authorization: Bearer <session>``), the ``user``
field. A registry with a ``factory`` opens a session the first time it sees a
name (``t1ops engine serve --openai``); without one an unknown session is a
404 (a campaign opens each trial's session itself).

The app is Starlette, served by uvicorn in a background thread; the blocking
engine call runs in a worker thread so sessions proceed concurrently.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from rl.errors import T1OpsError
from rl.harness.openai_api import ApiError, completion_json, parse_request, stream_events
from rl.harness.session import HarnessSession

DEFAULT_SESSION = "default"
SAFE_SESSION = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
MAX_BODY_BYTES = 8 * 2**20        # a chat request is a conversation, not a data set: 413 above
MAX_SESSIONS = 4096               # sessions a factory may open at once


class SessionRegistry:
    """Sessions by name; thread-safe. With a ``factory``, a session opens on first sight of a
    plain name (:data:`SAFE_SESSION`; anything else is a 400) and one unused for ``idle_s``
    is dropped (at most :data:`MAX_SESSIONS` open: a 429 past that)."""

    def __init__(self, factory: Callable[[str], HarnessSession] | None = None, *,
                 idle_s: float | None = None) -> None:
        self.factory, self.idle_s = factory, idle_s
        self._sessions: dict[str, HarnessSession] = {}
        self._used: dict[str, float] = {}
        self._lock = threading.Lock()

    def expire(self, now: float | None = None) -> list[str]:
        """Drop the factory-opened sessions unused for ``idle_s``; returns their names."""
        if self.idle_s is None:
            return []
        now = time.monotonic() if now is None else now
        with self._lock:
            gone = [n for n, t in self._used.items() if now - t > self.idle_s]
            dropped = [s for s in (self._sessions.pop(n, None) for n in gone) if s is not None]
            for n in gone:
                self._used.pop(n, None)
        for session in dropped:   # outside the registry lock: a session's own lock may wait
            session.close()
        return gone

    def add(self, session: HarnessSession) -> HarnessSession:
        with self._lock:
            if session.session_id in self._sessions:
                raise ValueError(f"session {session.session_id!r} already exists")
            self._sessions[session.session_id] = session
        return session

    def remove(self, session_id: str) -> HarnessSession | None:
        with self._lock:
            return self._sessions.pop(session_id, None)

    def sessions(self) -> list[HarnessSession]:
        with self._lock:
            return list(self._sessions.values())

    def resolve(self, path_sid: str | None, api_key: str | None, user: str | None) -> HarnessSession:
        self.expire()
        with self._lock:
            for name in (path_sid, api_key, user):
                if name and name in self._sessions:
                    if name in self._used:
                        self._used[name] = time.monotonic()
                    return self._sessions[name]
            if self.factory is not None:
                name = path_sid or user or DEFAULT_SESSION
                if not isinstance(name, str) or not SAFE_SESSION.fullmatch(name):
                    raise ApiError(400, f"session name {str(name)[:40]!r}... must match {SAFE_SESSION.pattern}",
                                   code="invalid_session")
                if len(self._sessions) >= MAX_SESSIONS:
                    raise ApiError(429, f"{MAX_SESSIONS} sessions are open; retry after idle ones expire",
                                   code="too_many_sessions")
                session = self._sessions[name] = self.factory(name)
                self._used[name] = time.monotonic()
                return session
        raise ApiError(404, f"no session {path_sid or api_key or user!r} on this endpoint: use the base URL "
                       "(.../s/<session>/v1) or the API key your trial was given", code="session_not_found")


def _api_key(headers) -> str | None:
    auth = headers.get("authorization", "")
    return auth[7:].strip() or None if auth.lower().startswith("bearer ") else None


async def _bounded_body(request) -> bytes:
    """The request body, or a 413 once it passes :data:`MAX_BODY_BYTES` (declared or read)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or len(declared) > 12 or int(declared) > MAX_BODY_BYTES):
        raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes", code="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes", code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(registry: SessionRegistry, on_turn: Callable[[HarnessSession], None] | None = None):
    """The Starlette application."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def error(err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    async def chat(request: Request):
        try:
            try:
                body = json.loads(await _bounded_body(request))
            except (ValueError, RecursionError) as exc:
                raise ApiError(400, f"the request body is not JSON: {exc}", code="invalid_json") from None
            req = parse_request(body)
            session = registry.resolve(request.path_params.get("sid"), _api_key(request.headers), req.user)
            completion = await asyncio.to_thread(session.complete, req)
            if on_turn is not None:
                await asyncio.to_thread(on_turn, session)
        except ApiError as err:
            return error(err)
        except T1OpsError as err:
            return error(ApiError(400, f"{type(err).__name__}: {err}", code="invalid_request"))
        except Exception as exc:  # the endpoint answers 500 and keeps serving; the traceback goes to its log
            traceback.print_exc()
            return error(ApiError(500, f"internal error: {exc!r}", type="server_error", code="internal_error"))
        if req.stream:
            return StreamingResponse(iter(stream_events(completion, req)), media_type="text/event-stream")
        return JSONResponse(completion_json(completion, req))

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "t1ops", "object": "model", "created": 0,
                                                         "owned_by": "t1ops"}]})

    async def health(request: Request):
        return JSONResponse({"status": "ok", "sessions": len(registry.sessions())})

    return Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/s/{sid}/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/s/{sid}/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ])


class OpenAIServer:
    """Serves :func:`build_app` on ``host:port`` (``port=0``: any free one) or a unix socket ``uds``.

    ``uds``: the socket file is made 0666 and its directory 0711, so a harness
    running under a sandbox uid, in a private network namespace, can connect
    (path sockets are not network-namespaced). Knowing a session name is what
    grants access to it; names are unguessable tokens in a campaign.
    """

    def __init__(self, registry: SessionRegistry, *, host: str = "127.0.0.1", port: int | None = 0,
                 uds: str | os.PathLike | None = None, on_turn: Callable[[HarnessSession], None] | None = None) -> None:
        self.registry, self.host, self.uds = registry, host, None if uds is None else Path(uds)
        self._sock = self._bind(host, port)
        self.port = None if self.uds else self._sock.getsockname()[1]
        self.app = build_app(registry, on_turn)
        self._server = None
        self._thread: threading.Thread | None = None

    def _bind(self, host: str, port: int | None) -> socket.socket:
        if self.uds is not None:
            self.uds.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(self.uds.parent, 0o711)
            self.uds.unlink(missing_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(self.uds))
            os.chmod(self.uds, 0o666)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port or 0))
        sock.listen(128)
        return sock

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``…/v1``); over a unix socket the host part is nominal."""
        return "http://t1ops/v1" if self.uds else f"http://{self.host}:{self.port}/v1"

    def session_url(self, session_id: str) -> str:
        return self.base_url[:-3] + f"/s/{session_id}/v1"

    def _config(self):
        import uvicorn

        return uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30)

    def start(self, timeout_s: float = 30.0) -> "OpenAIServer":
        import uvicorn

        self._server = uvicorn.Server(self._config())
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="openai-endpoint", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI endpoint did not start on {self.uds or self.port}")
            time.sleep(0.02)
        return self

    def serve_forever(self) -> None:
        import uvicorn

        self._server = uvicorn.Server(self._config())
        try:
            self._server.run(sockets=[self._sock])
        finally:
            self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sock.close()
        if self.uds is not None:
            self.uds.unlink(missing_ok=True)
