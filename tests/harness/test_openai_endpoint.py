"""Must show: the official ``openai`` client drives a multi-turn, tool-calling conversation
against the endpoint in front of a real embedded engine, and the recorded trajectory passes
the audit with 0 drift in the loss region (docs/harness.md)."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import openai
import pytest

from memorized import BASH_TOOL, COMMANDS, FINAL, SYSTEM, USER, serve_engine, train_engine
from rl.chat import ChatRenderer
from rl.harness.server import OpenAIServer, SessionRegistry
from rl.harness.session import HarnessSession, SessionLimits
from t1ops.audit import audit_dump, write_trajectory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def endpoint():
    renderer = ChatRenderer.default()
    engine, _ = train_engine(renderer)
    client = serve_engine(engine)
    sampled = []

    def generate(req):
        resp = client.generate(req)
        sampled.append(resp)
        return resp

    registry = SessionRegistry()
    server = OpenAIServer(registry).start()
    yield registry, server, generate, sampled, renderer
    server.close()


def _run_harness(base_url: str, workdir) -> tuple[list[dict], list]:
    """A minimal harness on the official client: bash tool calls until a final answer."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    replies = []
    for _ in range(6):
        out = client.chat.completions.create(model="t1ops", messages=messages, tools=[BASH_TOOL], temperature=0,
                                             logprobs=True, max_tokens=64)
        msg = out.choices[0].message
        replies.append(out)
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            cmd = json.loads(call.function.arguments)["command"]
            res = subprocess.run(["bash", "-c", cmd], cwd=workdir, capture_output=True, text=True, timeout=10)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": res.stdout.strip()})
    return messages, replies


def test_openai_client_multi_turn_tool_calls_audit_clean(endpoint, tmp_path):
    registry, server, generate, sampled, renderer = endpoint
    sampled.clear()
    session = registry.add(HarnessSession("trial-a", generate, renderer, SessionLimits(max_new_tokens=64),
                                          group_id="g0", prompt_id="hello"))
    work = tmp_path / "ws"
    work.mkdir()
    messages, replies = _run_harness(server.session_url("trial-a"), work)

    # the conversation: two tool calls that really ran, then a final answer
    calls = [json.loads(c["function"]["arguments"])["command"] for m in messages if m["role"] == "assistant"
             for c in m.get("tool_calls", [])]
    assert calls == list(COMMANDS)
    assert (work / "hello.txt").read_text().strip() == "hi"
    assert replies[-1].choices[0].message.content == FINAL and replies[-1].choices[0].finish_reason == "stop"
    assert [r.choices[0].finish_reason for r in replies[:-1]] == ["tool_calls", "tool_calls"]
    assert all(r.choices[0].logprobs.content for r in replies)

    chunks = session.finish()
    assert [c.meta["group_id"] for c in chunks] == ["g0"] * len(chunks)
    # loss-bearing tokens are exactly the engine's sampled ids, with its log-probs
    got = np.concatenate([c.tokens[c.loss_mask == 1] for c in chunks])
    want = np.concatenate([np.asarray(r.output_ids) for r in sampled])
    assert got.tolist() == want.tolist()
    got_lp = np.concatenate([c.rollout_logprobs[c.loss_mask == 1] for c in chunks])
    assert np.allclose(got_lp, np.concatenate([np.asarray(r.output_token_logprobs) for r in sampled]))
    stats = session.stats()
    assert stats["model_calls"] == 3 and sum(stats["relations"].values()) == 3
    # Qwen3 replies open with an empty <think></think>; the client sends back reasoning_content "",
    # which the template does not re-render in history: one bounded repair per later turn
    assert stats["relations"] == {"strict": 1, "normalized": 2}, stats

    dump = tmp_path / "dump"
    for c in chunks:
        write_trajectory(c, dump)
    rep = audit_dump(dump)
    assert rep.drift_in_loss == 0 and rep.samples == 1
    assert rep.loss_positions == len(want)


def test_unknown_session_and_bad_request_get_openai_errors(endpoint):
    registry, server, generate, sampled, renderer = endpoint
    client = openai.OpenAI(base_url=server.session_url("nobody"), api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="t1ops", messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["code"] == "session_not_found"
    registry.add(HarnessSession("trial-b", generate, renderer))
    client = openai.OpenAI(base_url=server.session_url("trial-b"), api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="t1ops", messages=[{"role": "user", "content": "hi"}], n=2)
    assert err.value.body["param"] == "n" and err.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="t1ops", messages=[{"role": "wizard", "content": "hi"}])
    assert "role must be one of" in err.value.body["message"]
