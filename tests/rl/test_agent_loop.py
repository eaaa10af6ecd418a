"""The agent loop over a real sandbox, with a scripted policy standing in for the engine.

The scripted policy answers with text we choose, encoded by the real tokenizer, so
the tests control the turn structure; the sandbox, the renderer and TITO are real.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rl.agent.loop import AgentSettings, initial_messages, parse_command, run_episode, sft_example, solution_command, tool_call_text
from rl.agent.sandbox import Sandbox
from rl.agent.tasks import load_task
from rl.chat import IM_END_ID, ChatRenderer
from rl.engines.protocol import FinishReason, GenerateResponse
from rl.errors import MissingRoutingError

REPO = Path(__file__).resolve().parents[2]
L, K = 2, 2


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer.default()


def _scripted(renderer, replies, *, routing=True, seen=None):
    """A policy that answers each turn with the next text in ``replies``."""
    it = iter(replies)

    def generate(req):
        text, stop = next(it)
        ids = renderer.encode(text) + ([IM_END_ID] if stop else [])
        if seen is not None:
            seen.append(req)
        rows = None
        if routing:
            n = len(req.input_ids) + len(ids) - 1 - req.routed_experts_start_len
            rows = np.arange(n * L * K, dtype=np.int32).reshape(n, L, K) % 8
        return GenerateResponse(output_ids=tuple(ids), output_token_logprobs=tuple([-0.5] * len(ids)),
                                finish_reason=FinishReason("stop" if stop else "length"), weight_version="3",
                                prompt_tokens=len(req.input_ids), completion_tokens=len(ids),
                                routed_experts_RLK=rows)
    return generate


def _trial(tmp_path, name="files-hello"):
    task = load_task(REPO / "examples" / "tasks" / name)
    sb = Sandbox(tmp_path, "run-test")
    return task, sb.create(task, 0)


def test_episode_runs_command_and_keeps_sampled_ids(tmp_path, renderer):
    task, trial = _trial(tmp_path)
    cmd = solution_command(task.solution)
    seen = []
    ep = run_episode(task.instruction, trial.exec, _scripted(renderer, [(tool_call_text(cmd), True), ("Done.", True)], seen=seen),
                     renderer, AgentSettings(max_turns=3, num_layers=L, topk=K), sample_id="s0", group_id="g0", prompt_id=task.name)
    assert ep.end_reason == "done" and ep.num_turns == 2 and ep.commands == [cmd]
    (traj,) = ep.chunks
    traj.check_invariants()
    assert traj.routing.shape == (len(traj.tokens), L, K)
    # the second prompt is exactly the stream so far: token-in, token-out
    assert list(seen[1].input_ids) == list(traj.tokens[: len(seen[1].input_ids)])
    sampled = traj.tokens[traj.loss_mask == 1]
    assert renderer.decode(sampled).startswith("<tool_call>")
    assert (traj.rollout_logprobs[traj.loss_mask == 0] == 0).all()
    assert (traj.policy_version[traj.loss_mask == 1] == 3).all()


def test_parse_failure_gets_corrective_observation(tmp_path, renderer):
    task, trial = _trial(tmp_path)
    ep = run_episode(task.instruction, trial.exec,
                     _scripted(renderer, [("<tool_call>{not json</tool_call>", True), ("ok", True)]),
                     renderer, AgentSettings(max_turns=3), sample_id="s1", group_id="g", prompt_id=task.name)
    assert ep.parse_failures == 1 and ep.end_reason == "done"
    text = renderer.decode(ep.chunks[0].tokens)
    assert "[parse error]" in text


def test_truncated_turn_ends_episode(tmp_path, renderer):
    task, trial = _trial(tmp_path)
    ep = run_episode(task.instruction, trial.exec, _scripted(renderer, [("echo", False)]),
                     renderer, AgentSettings(max_turns=3), sample_id="s2", group_id="g", prompt_id=task.name)
    assert ep.end_reason == "truncated" and ep.num_turns == 1


def test_missing_routing_aborts(tmp_path, renderer):
    task, trial = _trial(tmp_path)
    with pytest.raises(MissingRoutingError, match="s3"):
        run_episode(task.instruction, trial.exec, _scripted(renderer, [("hi", True)], routing=False),
                    renderer, AgentSettings(num_layers=L, topk=K), sample_id="s3", group_id="g", prompt_id=task.name)


def test_context_budget_is_never_exceeded(tmp_path, renderer):
    task, trial = _trial(tmp_path)
    seen = []
    prompt_len = len(renderer.render_prompt(initial_messages(task.instruction)))
    settings = AgentSettings(max_turns=4, max_new_tokens=64, context_window=prompt_len + 90, min_new_tokens=8)
    replies = [(tool_call_text("echo " + "a" * 40), True)] * 4
    ep = run_episode(task.instruction, trial.exec, _scripted(renderer, replies, seen=seen), renderer, settings,
                     sample_id="s4", group_id="g", prompt_id=task.name)
    assert len(seen) >= 2
    assert all(len(r.input_ids) + r.sampling_params.max_new_tokens <= settings.context_window for r in seen)
    assert ep.budget_clamps > 0 and ep.end_reason in ("context_exhausted", "truncated")


def test_parse_command_cases():
    assert parse_command(tool_call_text("ls -la")) == ("ls -la", None)
    assert parse_command("all done") == (None, None)
    cmd, problem = parse_command('<tool_call>\n{"name": "python", "arguments": {}}\n</tool_call>')
    assert cmd is None and "unknown tool" in problem


def test_sft_example_masks_only_assistant(renderer):
    toks, mask = sft_example("Say hi.", "echo hi", renderer)
    assert len(toks) == len(mask) and sum(mask) > 0
    assistant = renderer.decode([t for t, m in zip(toks, mask) if m])
    assert "echo hi" in assistant and "Say hi" not in assistant
