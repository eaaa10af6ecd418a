"""The example harness's MCP side: start stdio MCP servers, offer their tools, dispatch calls.

Written on the `mcp` SDK alone (it runs inside the trial, where t1ops is not importable):
tools become OpenAI tools named `<server>_<tool>`; a single-argument envelope (one object
parameter) is flattened and re-wrapped at dispatch; a result's text blocks become the tool
message; a fatal session error gets one reconnect. t1ops's builtin agent does the same in
rl/harness/mcp_tools.py.
"""
from __future__ import annotations

import asyncio
import os
import threading


def _flatten(server: str, tool) -> tuple[dict, str | None]:
    schema = dict(tool.input_schema or {"type": "object", "properties": {}})
    props, wrap = schema.get("properties") or {}, None
    if len(props) == 1:
        key, inner = next(iter(props.items()))
        ref = inner.get("$ref", "")
        inner = schema.get("$defs", {}).get(ref.split("/")[-1], inner) if ref else inner
        if inner.get("type") == "object" and inner.get("properties"):
            wrap, schema = key, {**inner, **({"$defs": schema["$defs"]} if "$defs" in schema else {})}
    schema.pop("title", None)
    return {"type": "function", "function": {"name": f"{server}_{tool.name}", "description": tool.description or
                                             tool.name, "parameters": schema}}, wrap


class McpTools:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.sessions, self.stops, self.routes, self.openai_tools = {}, {}, {}, []

    @classmethod
    def start(cls, servers: list[dict]) -> "McpTools":
        self = cls()
        for s in servers:
            self._sync(self._connect(s))
            for tool in self._sync(self.sessions[s["name"]].list_tools()).tools:
                oa, wrap = _flatten(s["name"], tool)
                self.routes[oa["function"]["name"]] = (s, tool.name, wrap)
                self.openai_tools.append(oa)
        return self

    @property
    def names(self) -> list[str]:
        return list(self.routes)

    def _sync(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _connect(self, server: dict) -> None:
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=server["argv"][0], args=server["argv"][1:], cwd=os.getcwd(),
                                       env=dict(os.environ))
        ready, stop = asyncio.get_running_loop().create_future(), asyncio.Event()

        async def hold():
            try:
                async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
                    await session.initialize()
                    self.sessions[server["name"]] = session
                    ready.set_result(None)
                    await stop.wait()
            except BaseException as exc:
                self.sessions.pop(server["name"], None)
                if not ready.done():
                    ready.set_exception(exc)

        self.stops[server["name"]] = stop
        asyncio.ensure_future(hold())
        await ready

    def call(self, name: str, args: dict) -> str:
        server, tool, wrap = self.routes[name]
        payload = {wrap: args} if wrap else args
        for attempt in (0, 1):
            try:
                res = self._sync(self.sessions[server["name"]].call_tool(tool, payload))
                text = "\n".join(getattr(b, "text", f"[{b.type} content]") for b in res.content)
                return f"[tool error] {text}" if res.is_error else text
            except Exception as exc:  # the session died: one reconnect, then report
                if attempt:
                    return f"[tool error] {type(exc).__name__}: {exc}"
                self.stops[server["name"]].set()
                self._sync(self._connect(server))
        return "[tool error] unreachable"

    def close(self) -> None:
        for stop in self.stops.values():
            self.loop.call_soon_threadsafe(stop.set)
