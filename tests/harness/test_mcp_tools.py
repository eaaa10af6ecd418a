"""MCP tools: schema conversion (envelopes flattened and re-wrapped), real stdio server, one reconnect."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rl.harness.mcp_tools import McpToolbox, to_openai_tool, wrap_arguments

SERVER = Path(__file__).resolve().parents[2] / "examples" / "harness" / "mcp_files_server.py"


def test_envelope_is_flattened_and_rewrapped():
    schema = {"type": "object", "required": ["request"], "properties": {"request": {"$ref": "#/$defs/W"}},
              "$defs": {"W": {"type": "object", "title": "W", "required": ["path"],
                              "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}
    tool, env = to_openai_tool("files", "write_file", "Write.", schema)
    assert env == "request" and tool["function"]["name"] == "files_write_file"
    assert set(tool["function"]["parameters"]["properties"]) == {"path", "content"}
    assert wrap_arguments({"path": "a", "content": "b"}, env) == {"request": {"path": "a", "content": "b"}}
    plain, env2 = to_openai_tool("files", "read_file", None, {"type": "object", "properties": {"path": {"type": "string"}}})
    assert env2 is None and plain["function"]["parameters"]["properties"] == {"path": {"type": "string"}}


@pytest.fixture
def toolbox(tmp_path):
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)], cwd=str(tmp_path),
                                   env={"PATH": os.environ["PATH"]})
    box = McpToolbox([("files", params)])
    yield box, tmp_path
    box.close()


def test_real_server_calls_and_one_reconnect(toolbox):
    box, ws = toolbox
    assert sorted(box.names) == ["files_list_files", "files_read_file", "files_write_file"]
    assert "wrote 2 chars" in box.call("files_write_file", {"path": "a.txt", "content": "hi"})
    assert (ws / "a.txt").read_text() == "hi"
    assert box.call("files_read_file", {"path": "a.txt"}) == "hi"
    assert box.call("files_read_file", {"path": "../x"}).startswith("[tool error]")
    # kill the server process: the next call reconnects once and succeeds
    import psutil

    kids = [p for p in psutil.Process().children(recursive=True) if str(SERVER) in " ".join(p.cmdline())]
    assert kids
    for p in kids:
        p.kill()
    assert box.call("files_read_file", {"path": "a.txt"}) == "hi"
    assert box.reconnects == 1
