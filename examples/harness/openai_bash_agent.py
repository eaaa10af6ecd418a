"""An example agent harness on the official `openai` client, with one bash tool.

It is what a team would ship: its own loop, its own history handling. t1ops runs
it as the trial's agent (`rollout.agent = "command"`, docs/harness.md) with:

- OPENAI_BASE_URL / OPENAI_API_KEY: the trial's session on the t1ops endpoint;
- T1OPS_OPENAI_SOCKET: the endpoint's unix socket (the sandbox has no network);
- T1OPS_INSTRUCTION, T1OPS_WORKSPACE, T1OPS_MAX_TURNS;
- T1OPS_MCP_SERVERS: stdio MCP servers whose tools it offers next to bash
  (examples/harness/mcp_client.py).

Like many real harnesses it keeps history as parsed messages and re-serialises
tool arguments compactly (`json.dumps(..., separators=(",", ":"))`), so its
re-rendered prompts are not token-identical to what the model sampled: the
endpoint relates them to the token stream (normalized repairs) and the audit
counts them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import openai

SYSTEM = ("You are a terminal agent. Solve the task by running shell commands with the bash tool, one "
          "command per turn. Reply without a tool call when you are done.")
BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run one shell command in the workspace and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
MAX_OUTPUT = 2000


def client() -> openai.OpenAI:
    sock = os.environ.get("T1OPS_OPENAI_SOCKET")
    http = httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=600) if sock else None
    return openai.OpenAI(http_client=http, max_retries=0)


def run_bash(command: str) -> str:
    try:
        # the harness starts in the workspace (T1OPS_WORKSPACE names it; its parents may be closed to us)
        res = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "[stopped: timeout]"
    out = (res.stdout + (("\n" + res.stderr) if res.stderr else "")).strip()[:MAX_OUTPUT]
    return f"{out}\n[exit code {res.returncode}]" if out else f"[exit code {res.returncode}]"


def main() -> int:
    api = client()
    tools, dispatch = [BASH], {"bash": lambda args: run_bash(str(args.get("command", "")))}
    mcp = None
    if json.loads(os.environ.get("T1OPS_MCP_SERVERS") or "[]"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from mcp_client import McpTools

        mcp = McpTools.start(json.loads(os.environ["T1OPS_MCP_SERVERS"]))
        tools += mcp.openai_tools
        dispatch.update({name: (lambda args, n=name: mcp.call(n, args)) for name in mcp.names})
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": os.environ["T1OPS_INSTRUCTION"]}]
    try:
        for _ in range(int(os.environ.get("T1OPS_MAX_TURNS", "8"))):
            try:
                reply = api.chat.completions.create(model="t1ops", messages=messages, tools=tools)
            except openai.APIStatusError as err:  # budget spent or an unparseable reply: the episode ends
                print(f"endpoint: {err.status_code} {err.body}", file=sys.stderr)
                return 0
            msg = reply.choices[0].message
            calls = msg.tool_calls or []
            # history as this harness keeps it: parsed, arguments re-serialised compactly
            messages.append({"role": "assistant", "content": msg.content or "", "tool_calls": [
                {"id": c.id, "type": "function", "function": {
                    "name": c.function.name,
                    "arguments": json.dumps(json.loads(c.function.arguments), separators=(",", ":"))}}
                for c in calls]} if calls else {"role": "assistant", "content": msg.content or ""})
            if not calls or reply.choices[0].finish_reason == "length":
                return 0
            for c in calls:
                fn = dispatch.get(c.function.name)
                out = fn(json.loads(c.function.arguments)) if fn else f"unknown tool {c.function.name}"
                messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
    finally:
        if mcp is not None:
            mcp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
