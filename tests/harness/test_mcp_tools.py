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


def test_server_runs_inside_the_trial_sandbox(tmp_path):
    """The builtin agent's MCP server is a jailed process: it writes the trial's workspace as the trial uid."""
    from rl.agent.sandbox import Sandbox
    from rl.agent.tasks import load_task
    from rl.harness.command_agent import harness_python
    from rl.harness.mcp_jail import jailed_server

    task = load_task(SERVER.parents[1] / "tasks" / "files-hello")
    trial = Sandbox(tmp_path, "run-mcp").create(task, 0)
    python, pythonpath = harness_python()
    env = {"PYTHONPATH": pythonpath} if pythonpath else {}
    try:
        params = jailed_server(trial, [python, "/opt/t1ops-harness/mcp_files_server.py"], env,
                               harness_dir=SERVER.parent)
        box = McpToolbox([("files", params)])
        try:
            assert "wrote" in box.call("files_write_file", {"path": "out.txt", "content": "hello\n"})
            assert "out.txt" in box.call("files_list_files", {}).splitlines()
        finally:
            box.close()
        out = trial.workspace / "out.txt"
        assert out.read_text() == "hello\n" and out.stat().st_uid == trial.uid
    finally:
        trial.close()


def test_builtin_agent_uses_mcp_tools_in_the_sandbox(tmp_path):
    """The builtin loop offers the MCP tools next to bash (tools section in the prompt) and
    dispatches a call to the jailed server; its result comes back as the observation."""
    from rl.agent.loop import AgentSettings, run_episode
    from rl.agent.sandbox import Sandbox
    from rl.agent.tasks import load_task
    from rl.chat import IM_END_ID, ChatRenderer
    from rl.engines.protocol import FinishReason, GenerateResponse
    from rl.harness.command_agent import HarnessSettings
    from t1ops.campaign.harness import HarnessHost

    renderer = ChatRenderer.default()
    replies = iter(['<tool_call>\n{"name": "files_write_file", "arguments": {"path": "notes.txt", "content": "ready\\n"}}'
                    '\n</tool_call>', '<tool_call>\n{"name": "bash", "arguments": {"command": "cat notes.txt"}}\n</tool_call>',
                    "Done."])
    prompts = []

    def generate(req):
        prompts.append(renderer.decode(req.input_ids))
        ids = renderer.encode(next(replies)) + [IM_END_ID]
        return GenerateResponse(output_ids=tuple(ids), output_token_logprobs=tuple([-0.3] * len(ids)),
                                finish_reason=FinishReason("stop"), weight_version="0",
                                prompt_tokens=len(req.input_ids), completion_tokens=len(ids))

    host = HarnessHost(HarnessSettings(argv=("unused",), command=False, mcp_servers=(
        ("files", ("{python}", "{harness}/mcp_files_server.py")),)), AgentSettings(), renderer)
    task = load_task(SERVER.parents[1] / "mcp" / "tasks" / "files-note-mcp")   # needs the MCP tool
    trial = Sandbox(tmp_path, "run-b").create(task, 0)
    try:
        tools = host.toolbox(trial)
        try:
            ep = run_episode(task.instruction, trial.exec, generate, renderer, AgentSettings(max_turns=4),
                             sample_id="s", group_id="g", prompt_id=task.name, tools=tools)
        finally:
            tools.close()
        assert ep.end_reason == "done" and ep.num_turns == 3
        assert '"name": "files_write_file"' in prompts[0]            # the tools section lists the MCP tools
        assert "wrote 6 chars to notes.txt" in prompts[1]            # the MCP result is the observation
        assert "ready\n[exit code 0]" in prompts[2]                  # bash sees the file the server wrote
        from rl.agent.verifier import verify

        verdict = verify(trial, scale=20.0)                            # the task's tests pass: both checks
        assert (verdict.reward.passed, verdict.reward.total) == (2, 2)
    finally:
        trial.close()
        host.close()
