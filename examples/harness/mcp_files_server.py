"""A small MCP server (stdio) with file tools over the current directory (the trial's workspace).

Tools: ``list_files(path=".")``, ``read_file(path)``, and ``write_file(request)`` whose single
argument is a request envelope ``{"path": ..., "content": ...}`` (clients flatten such
envelopes into plain parameters and wrap them back at dispatch; docs/harness.md).
Paths are confined to the directory the server started in. Every call is appended to
``.mcp_calls.jsonl`` there, so a task's tests can check the tool was used.
Run: ``python mcp_files_server.py`` (speaks MCP on stdin/stdout; mcp 2.x ``MCPServer``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, Field

from mcp.server.mcpserver import MCPServer

ROOT = Path.cwd().resolve()
LOG = ROOT / ".mcp_calls.jsonl"
server = MCPServer("t1ops-files")


class WriteRequest(BaseModel):
    path: str = Field(description="File path relative to the workspace.")
    content: str = Field(description="The whole new content of the file.")


def _inside(path: str) -> Path:
    target = (ROOT / path).resolve()
    if target != ROOT and ROOT not in target.parents:
        raise ValueError(f"{path!r} is outside the workspace")
    return target


def _log(tool: str, **args) -> None:
    with open(LOG, "a") as f:
        f.write(json.dumps({"tool": tool, **args}) + "\n")


@server.tool()
def list_files(path: str = ".") -> str:
    """List the entries of a directory in the workspace (directories end with '/')."""
    _log("list_files", path=path)
    base = _inside(path)
    return "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in base.iterdir()
                            if p.name != LOG.name))


@server.tool()
def read_file(path: str) -> str:
    """Read a text file of the workspace."""
    _log("read_file", path=path)
    return _inside(path).read_text()


@server.tool()
def write_file(request: WriteRequest) -> str:
    """Write a text file of the workspace (created or replaced)."""
    _log("write_file", path=request.path)
    target = _inside(request.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(request.content)
    return f"wrote {len(request.content)} chars to {request.path}"


if __name__ == "__main__":
    os.chdir(ROOT)
    server.run("stdio")
