"""End reasons that mean one thing (issue 50), in both agents: ``context_exhausted`` when a reply filled
the context, ``truncated`` only for the walkthrough's case (the per-turn cap with no tool call),
``max_new_tokens`` when the cap cut a reply that called a tool. Each failed before issue 50: the builtin
loop called every cut reply ``truncated`` (a full context included, and a reply with a tool call), and the
command harness's session never reported a cut reply at all (its trial ended "done")."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rl.agent.loop import AgentSettings, initial_messages, run_episode, tool_call_text
from rl.chat import IM_END_ID, ChatRenderer
from rl.chat.template import render
from rl.engines.protocol import FinishReason, GenerateResponse
from rl.harness.command_agent import outcome
from rl.harness.openai_api import parse_request
from rl.harness.session import HarnessSession, SessionLimits

INSTRUCTION = "Print hello."


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer.default()


def _cut(renderer, text: str | None = None):
    """An engine whose every reply uses all of its ``max_new_tokens`` with no stop token: ``text``
    (then filler) or filler only."""
    def generate(req):
        n = req.sampling_params.max_new_tokens
        ids = (renderer.encode(text) if text else []) + renderer.encode(" a" * n)
        ids = ids[:n]
        return GenerateResponse(output_ids=tuple(ids), output_token_logprobs=tuple([-0.5] * len(ids)),
                                finish_reason=FinishReason("length"), weight_version="0",
                                prompt_tokens=len(req.input_ids), completion_tokens=len(ids))
    return generate


def _episode(renderer, generate, *, free: int, cap: int):
    prompt = len(renderer.render_prompt(initial_messages(INSTRUCTION)))
    settings = AgentSettings(max_turns=3, max_new_tokens=cap, context_window=prompt + free, min_new_tokens=4)
    return run_episode(INSTRUCTION, lambda cmd: None, generate, renderer, settings, sample_id="s", group_id="g",
                       prompt_id="t")


def test_builtin_loop_a_full_context_is_context_exhausted_not_truncated(renderer):
    ep = _episode(renderer, _cut(renderer), free=20, cap=64)  # the cap is lowered to the 20 tokens left
    assert ep.budget_clamps == 1 and ep.end_reason == "context_exhausted"


def test_builtin_loop_truncated_only_without_a_tool_call(renderer):
    assert _episode(renderer, _cut(renderer), free=500, cap=24).end_reason == "truncated"
    call = tool_call_text("echo hello")
    cap = len(renderer.encode(call)) + 6
    assert _episode(renderer, _cut(renderer, call), free=500, cap=cap).end_reason == "max_new_tokens"


def _session(renderer, generate, *, free: int, cap: int) -> HarnessSession:
    """A session whose first request's prompt leaves ``free`` tokens of context, capped at ``cap``."""
    prompt = renderer.encode(render([{"role": "user", "content": INSTRUCTION}], []))
    return HarnessSession("sess", generate, renderer,
                          SessionLimits(max_new_tokens=cap, context_window=len(prompt) + free, min_new_tokens=4))


def _ask(session):
    return session.complete(parse_request({"model": "m", "messages": [{"role": "user", "content": INSTRUCTION}]}))


def test_command_harness_reports_a_truncated_last_reply(renderer):
    session = _session(renderer, _cut(renderer), free=4000, cap=24)
    assert _ask(session).finish_reason == "length"
    assert session.stats()["end_reason"] == "truncated"
    res = SimpleNamespace(exit_code=0, reason="ok", stdout="", stderr="")
    assert outcome(session, res).end_reason == "truncated"  # the trial's end reason (rollout.truncated_reward_zero)


def test_command_harness_reports_a_full_context(renderer):
    session = _session(renderer, _cut(renderer), free=30, cap=512)
    _ask(session)
    assert session.stats()["end_reason"] == "context_exhausted"


def test_a_stopped_reply_after_a_cut_one_clears_it(renderer):
    replies = iter([False, True])

    def generate(req):
        stop = next(replies)
        ids = renderer.encode("hello") + ([IM_END_ID] if stop else [])
        return GenerateResponse(output_ids=tuple(ids), output_token_logprobs=tuple([-0.5] * len(ids)),
                                finish_reason=FinishReason("stop" if stop else "length"), weight_version="0",
                                prompt_tokens=len(req.input_ids), completion_tokens=len(ids))
    session = _session(renderer, generate, free=4000, cap=64)
    _ask(session)
    assert session.stats()["end_reason"] == "truncated"
    _ask(session)
    assert session.stats()["end_reason"] == "done"
