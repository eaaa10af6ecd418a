"""MCP servers a task declares (``[[environment.mcp_servers]]`` in task.toml), started inside
its container before the agent starts — the walkthrough's trial lifecycle, section 2.

A stdio server (``command`` + ``args``) is started in the trial's container as the agent uid
(``podman exec -i``) and must answer ``initialize`` and ``tools/list`` within
:data:`READY_TIMEOUT_S`; otherwise trial creation fails with :class:`McpNotReady` naming the
server and what it did (exit code, stderr tail, or silence). Its tools are recorded on the
trial (``trial.mcp_tools``). A server reached by ``url`` only (a compose sidecar) is refused by
name: one container per trial has no sidecars. A reply is outside data (issue #51): bounded in
size and nesting before it is parsed, quoted only through ``short``; a server that breaks a
bound is :class:`McpNotReady`, never a crash of ``tasks run``.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import time

from rl.agent.bounded import check_nesting, short
from rl.agent.container import images, runtime
from rl.errors import SandboxError

READY_TIMEOUT_S = float(os.environ.get("T1OPS_MCP_READY_TIMEOUT_S", "30"))
PROTOCOL = "2025-03-26"
MAX_REPLY_BYTES = 4 * 2**20   # a tools/list of a few hundred tools is tens of KiB
MAX_TOOLS = 1024


class McpNotReady(SandboxError):
    """A task's MCP server did not answer tools/list in time (trial end reason ``mcp-not-ready``)."""


def declared(task) -> list[dict]:
    servers = images.task_settings(task).get("mcp_servers") or []
    return [s for s in servers if isinstance(s, dict)]


def start_mcp_servers(trial, timeout_s: float = READY_TIMEOUT_S) -> dict[str, list[str]]:
    """Probe every declared server in ``trial``'s container; ``{server: [tool names]}``."""
    out: dict[str, list[str]] = {}
    for i, s in enumerate(declared(trial.task)):
        name = str(s.get("name") or f"server{i}")
        if not s.get("command"):
            raise McpNotReady(f"{trial.task.name}: MCP server {name!r} ({s.get('transport', '?')} at "
                              f"{s.get('url', '?')}) is a sidecar service; the container backend "
                              "runs one container per trial: give it a stdio command", server=name)
        argv = [str(s["command"]), *[str(a) for a in s.get("args") or []]]
        out[name] = probe(trial, name, argv, {str(k): str(v) for k, v in (s.get("env") or {}).items()},
                          timeout_s)
    trial.mcp_tools = out
    return out


def probe(trial, name: str, argv: list[str], env: dict[str, str], timeout_s: float) -> list[str]:
    cmd = [runtime.cli(), "exec", "-i", "--user", f"{trial.uid}:{trial.uid}", "--workdir", trial.workdir,
           *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], trial.container, *argv]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    try:
        _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL, "capabilities": {},
            "clientInfo": {"name": "t1ops", "version": "1"}}})
        _await(proc, 1, deadline, trial, name)
        _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _send(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        res = _await(proc, 2, deadline, trial, name)
        tools = (res.get("result") or {}) if isinstance(res.get("result"), dict) else {}
        listed = tools.get("tools") if isinstance(tools.get("tools"), list) else []
        return [short(t.get("name", "?"), 128) if isinstance(t, dict) else "?" for t in listed[:MAX_TOOLS]]
    finally:
        proc.kill()
        proc.wait()


def _send(proc, msg: dict) -> None:
    try:
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()
    except BrokenPipeError:
        pass


def _await(proc, want_id: int, deadline: float, trial, name: str) -> dict:
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise McpNotReady(f"{trial.task.name}: MCP server {name!r} did not answer "
                              f"{'tools/list' if want_id == 2 else 'initialize'} within "
                              f"{READY_TIMEOUT_S:g}s", server=name)
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
        if not ready:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace").strip()[-300:]
                raise McpNotReady(f"{trial.task.name}: MCP server {name!r} exited {proc.returncode} "
                                  f"before answering: {err or 'no output'}", server=name)
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:   # its output closed: it exited (or is about to)
            try:
                rc = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                rc = "?"
            err = proc.stderr.read().decode(errors="replace").strip()[-300:]
            raise McpNotReady(f"{trial.task.name}: MCP server {name!r} exited {rc} before "
                              f"answering: {err or 'no output'}", server=name)
        buf += chunk
        if len(buf) > MAX_REPLY_BYTES:   # a reply is bounded before it is parsed (issue #51)
            raise McpNotReady(f"{trial.task.name}: MCP server {name!r} sent over {MAX_REPLY_BYTES} bytes "
                              "without finishing a reply", server=name)
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode("utf-8", errors="replace")
            deep = check_nesting(text)
            if deep:
                raise McpNotReady(f"{trial.task.name}: MCP server {name!r} sent a reply that {deep}",
                                  server=name)
            try:
                msg = json.loads(text)
            except (ValueError, RecursionError):
                continue
            if isinstance(msg, dict) and msg.get("id") == want_id:
                if "error" in msg:
                    raise McpNotReady(f"{trial.task.name}: MCP server {name!r} answered with an "
                                      f"error: {short(msg['error'], 300)}", server=name)
                return msg
