"""Tools from stdio MCP servers as OpenAI tools, with a synchronous dispatcher.

:class:`McpToolbox` starts each configured server with the ``mcp`` SDK's
``stdio_client`` (the caller decides how: in a campaign the server process is
started inside the trial's sandbox, :mod:`rl.harness.mcp_jail`), lists its
tools and converts them (:func:`to_openai_tool`):

- the OpenAI name is ``<server>_<tool>`` (unique across servers);
- a tool whose input schema is a single-argument *envelope* (one property,
  itself an object, e.g. ``write_file(request: {path, content})``) is offered
  flattened (the envelope's fields as parameters) and re-wrapped at dispatch
  (``{"request": {...}}``), which saves schema tokens and matches what models
  are trained on (SkyRL walkthrough, section 3);
- a call's content blocks become the text of one tool message (text blocks
  joined; other block kinds named), prefixed ``[tool error]`` when the server
  reports an error.

A fatal session error (the server died, the stream closed) is answered by one
reconnect and one retry; a second failure is returned as a tool error text
and the server is marked dead for the rest of the trial.
"""
from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from rl.errors import InputError

CALL_TIMEOUT_S = 60.0
MAX_RESULT_CHARS = 256 * 1024   # one tool message; the agent's context is the real bound
START_TIMEOUT_S = 60.0


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return root.get("$defs", {}).get(ref.split("/")[-1], schema)
    return schema


def to_openai_tool(server: str, name: str, description: str | None, schema: dict) -> tuple[dict, str | None]:
    """(OpenAI tool, envelope key or None) for one MCP tool (see module docstring)."""
    schema = schema or {"type": "object", "properties": {}}
    props = schema.get("properties") or {}
    wrap = None
    params = schema
    if len(props) == 1:
        key, inner = next(iter(props.items()))
        inner = _resolve(inner, schema)
        if inner.get("type") == "object" and inner.get("properties"):
            wrap = key
            params = {k: v for k, v in inner.items() if k != "title"}
            if "$defs" in schema:
                params = {**params, "$defs": schema["$defs"]}
    params = {k: v for k, v in params.items() if k != "title"}
    full = re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}_{name}")[:64]
    fn = {"name": full, "description": description or name, "parameters": params}
    return {"type": "function", "function": fn}, wrap


def wrap_arguments(args: dict, envelope: str | None) -> dict:
    return {envelope: args} if envelope else args


def result_text(result: Any) -> str:
    parts = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'unknown')} content]")
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:   # a tool's reply is outside data: bounded (issue #51)
        text = f"{text[:MAX_RESULT_CHARS]}\n[tool output cut: {len(text) - MAX_RESULT_CHARS} more characters]"
    return f"[tool error] {text}" if getattr(result, "is_error", False) else text


@dataclass
class _Server:
    name: str
    params: Any                      # mcp StdioServerParameters
    session: Any = None
    stop: asyncio.Event | None = None
    task: asyncio.Task | None = None
    dead: str | None = None
    tools: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # openai name -> (mcp name, envelope)


class McpToolbox:
    """Stdio MCP servers behind a synchronous ``call(openai_name, args) -> str``."""

    def __init__(self, servers: list[tuple[str, Any]]) -> None:
        names = [n for n, _ in servers]
        if len(set(names)) != len(names):
            raise InputError(f"MCP server names must be unique, got {names}", argument="mcp.servers")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-tools", daemon=True)
        self._thread.start()
        self.servers = [_Server(n, p) for n, p in servers]
        self.openai_tools: list[dict] = []
        self.reconnects = 0
        try:
            for s in self.servers:
                self._run(self._connect(s), START_TIMEOUT_S)
                self.openai_tools += self._run(self._list(s), START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.openai_tools]

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _connect(self, s: _Server) -> None:
        from mcp import ClientSession
        from mcp.client.stdio import stdio_client

        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        s.stop = asyncio.Event()

        async def hold() -> None:
            try:
                async with stdio_client(s.params) as (read, write), ClientSession(read, write) as session:
                    await session.initialize()
                    s.session = session
                    ready.set_result(None)
                    await s.stop.wait()
            except BaseException as exc:  # startup failure or a session that died
                s.session = None
                if not ready.done():
                    ready.set_exception(exc)

        s.task = asyncio.ensure_future(hold())
        await ready

    async def _list(self, s: _Server) -> list[dict]:
        out = []
        for tool in (await s.session.list_tools()).tools:
            oa, envelope = to_openai_tool(s.name, tool.name, tool.description, dict(tool.input_schema or {}))
            s.tools[oa["function"]["name"]] = (tool.name, envelope)
            out.append(oa)
        return out

    def _server_of(self, name: str) -> _Server:
        for s in self.servers:
            if name in s.tools:
                return s
        raise InputError(f"no MCP tool {name!r}; available: {self.names}", tool=name)

    def call(self, name: str, args: dict) -> str:
        """Call one tool; the text of its result (or of the failure) for a tool message."""
        s = self._server_of(name)
        if s.dead:
            return f"[tool error] MCP server {s.name} is gone ({s.dead})"
        mcp_name, envelope = s.tools[name]
        payload = wrap_arguments(args, envelope)
        for attempt in (0, 1):
            try:
                if s.session is None:
                    raise ConnectionError(f"MCP server {s.name} session is closed")
                return result_text(self._run(s.session.call_tool(mcp_name, payload), CALL_TIMEOUT_S))
            except Exception as exc:  # noqa: BLE001 (any transport failure: one reconnect, then report it)
                if attempt == 1 or not _fatal(exc):
                    if _fatal(exc):
                        s.dead = repr(exc)[:200]
                    return f"[tool error] {type(exc).__name__}: {exc}"[:2000]
                self.reconnects += 1
                try:
                    self._run(self._restart(s), START_TIMEOUT_S)
                except Exception as err:  # noqa: BLE001
                    s.dead = repr(err)[:200]
                    return f"[tool error] MCP server {s.name} could not be restarted: {err}"
        raise AssertionError("unreachable")

    async def _restart(self, s: _Server) -> None:
        await self._stop(s)
        await self._connect(s)

    async def _stop(self, s: _Server) -> None:
        if s.stop is not None:
            s.stop.set()
        if s.task is not None:
            try:
                await asyncio.wait_for(s.task, 10)
            except BaseException:  # noqa: BLE001 (closing a broken session)
                pass
        s.session = None

    def close(self) -> None:
        if self._loop.is_closed():
            return
        for s in self.servers:
            try:
                self._run(self._stop(s), 20)
            except Exception:  # noqa: BLE001
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def _fatal(exc: BaseException) -> bool:
    """A transport-level failure (worth one reconnect), as opposed to a tool's own error."""
    import anyio

    return isinstance(exc, (ConnectionError, EOFError, BrokenPipeError, anyio.ClosedResourceError,
                            anyio.BrokenResourceError, anyio.EndOfStream)) or "closed" in str(exc).lower()


def dispatcher(toolbox: McpToolbox | None) -> Callable[[str, dict], str] | None:
    return None if toolbox is None else toolbox.call


def parse_arguments(text: Any) -> dict:
    if isinstance(text, dict):
        return text
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError("tool arguments must be a JSON object")
    return obj
