"""The command agent: the example harness (official openai client, bash tool) runs inside a real
sandbox (sandbox uid, private network namespace) and reaches the endpoint over its unix socket.

The policy is scripted here (real tokenizer ids) so the test controls the turns; the sandbox,
the harness process, the endpoint, the session and TITO are real. The campaign run with an
engine is `t1ops run examples/tiny/campaign-harness.toml` (docs/harness.md).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from rl.agent.loop import AgentSettings
from rl.agent.sandbox import Sandbox
from rl.agent.tasks import load_task
from rl.chat import IM_END_ID, ChatRenderer
from rl.engines.protocol import FinishReason, GenerateResponse
from rl.harness.command_agent import HarnessSettings
from t1ops.campaign.harness import HarnessHost

REPO = Path(__file__).resolve().parents[2]


def scripted(renderer, replies, seen):
    it = iter(replies)

    def generate(req):
        ids = renderer.encode(next(it)) + [IM_END_ID]
        seen.append((req, ids))
        return GenerateResponse(output_ids=tuple(ids), output_token_logprobs=tuple([-0.25] * len(ids)),
                                finish_reason=FinishReason("stop"), weight_version="2",
                                prompt_tokens=len(req.input_ids), completion_tokens=len(ids))
    return generate


@pytest.fixture(scope="module")
def host():
    renderer = ChatRenderer.default()
    h = HarnessHost(HarnessSettings(argv=("{python}", "{harness}/openai_bash_agent.py")),
                    AgentSettings(max_turns=4, max_new_tokens=64), renderer)
    yield h, renderer
    h.close()


def test_example_harness_runs_in_sandbox_and_records_a_normalized_trajectory(host, tmp_path):
    h, renderer = host
    task = load_task(REPO / "examples" / "tasks" / "files-hello")
    trial = Sandbox(tmp_path, "run-h").create(task, 0)
    seen = []
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hello > out.txt"}}\n</tool_call>'
    gen = scripted(renderer, [call, "Done."], seen)
    try:
        out = h.run(trial, task, gen, sample_id="s0", group_id="g0")
        trial.finish()
        assert out.exit_code == 0, out.stderr_tail
        assert (trial.workspace / "out.txt").read_text() == "hello\n"  # the harness's bash tool ran in the jail
    finally:
        trial.close()
    assert out.num_turns == 2 and out.end_reason == "done"
    # the harness re-serialised {"command": ...} compactly: one bounded repair, never a loss-region change
    assert out.stats["relations"] == {"strict": 1, "normalized": 1}
    (chunk,) = out.chunks
    assert chunk.meta["group_id"] == "g0" and chunk.meta["relations"] == ["strict", "normalized"]
    sampled = [i for _, ids in seen for i in ids]
    assert chunk.tokens[chunk.loss_mask == 1].tolist() == sampled
    assert renderer.decode(seen[1][0].input_ids).count('{"command":"echo hello > out.txt"}') == 1


def test_harness_that_never_calls_the_model_fails_loudly(host, tmp_path):
    h, renderer = host
    task = load_task(REPO / "examples" / "tasks" / "files-hello")
    trial = Sandbox(tmp_path, "run-h2").create(task, 0)
    broken = HarnessHost.__new__(HarnessHost)
    broken.__dict__.update(h.__dict__)
    broken.settings = HarnessSettings(argv=("/bin/false",))
    try:
        with pytest.raises(Exception, match="made no model call"):
            broken.run(trial, task, scripted(renderer, [], []), sample_id="s1", group_id="g1")
    finally:
        trial.close()


def test_example_harness_offers_mcp_tools_from_a_server_it_starts_in_the_sandbox(tmp_path):
    renderer = ChatRenderer.default()
    host = HarnessHost(HarnessSettings(argv=("{python}", "{harness}/openai_bash_agent.py"), mcp_servers=(
        ("files", ("{python}", "{harness}/mcp_files_server.py")),)), AgentSettings(max_turns=4, max_new_tokens=64),
        renderer)
    task = load_task(REPO / "examples" / "mcp" / "tasks" / "files-note-mcp")
    trial = Sandbox(tmp_path, "run-m").create(task, 0)
    seen = []
    call = ('<tool_call>\n{"name": "files_write_file", "arguments": {"path": "notes.txt", "content": "ready\\n"}}'
            '\n</tool_call>')
    try:
        out = host.run(trial, task, scripted(renderer, [call, "Done."], seen), sample_id="m0", group_id="gm")
        trial.finish()
        assert out.exit_code == 0, out.stderr_tail
        first_prompt = renderer.decode(seen[0][0].input_ids)
        assert '"name": "files_write_file"' in first_prompt and '"name": "bash"' in first_prompt
        assert "wrote 6 chars to notes.txt" in renderer.decode(seen[1][0].input_ids)
        from rl.agent.verifier import verify

        verdict = verify(trial, scale=20.0)
        assert (verdict.reward.passed, verdict.reward.total) == (2, 2)
    finally:
        trial.close()
        host.close()


def test_missing_routing_in_a_harness_trial_is_re_raised(host, tmp_path):
    """The harness only sees a 500; the trial still raises MissingRoutingError (the rollout aborts)."""
    from rl.errors import MissingRoutingError

    h, renderer = host

    def generate(req):
        raise MissingRoutingError("engine returned no routing", sample="s2", turn=0)

    task = load_task(REPO / "examples" / "tasks" / "files-hello")
    trial = Sandbox(tmp_path, "run-h3").create(task, 0)
    try:
        with pytest.raises(MissingRoutingError):
            h.run(trial, task, generate, sample_id="s2", group_id="g2")
    finally:
        trial.close()
