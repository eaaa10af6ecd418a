"""Property tests of the endpoint's session: generated conversations and re-render perturbations.

The engine is a scripted sampler (it returns the real tokenizer's ids of a chosen reply, or a
deliberately non-canonical byte-level tokenization of it); the session, template, parser and
TITO are real. For every generated conversation and perturbation the harness applies to its
history before re-sending it:

- loss-bearing tokens are exactly the engine's sampled ids, with its log-probs, and the
  trajectory's invariants hold (0 drift in the loss region);
- each perturbation maps to the relation expected of it (docs/harness.md).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl.chat import IM_END_ID, ChatRenderer
from rl.engines.protocol import FinishReason, GenerateResponse
from rl.harness.openai_api import parse_request
from rl.harness.session import HarnessSession, SessionLimits

BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}}}}
RENDERER = ChatRenderer.default()
EXPECTED = {"identity": "strict", "reorder_fields": "strict", "compact_json": "normalized",
            "key_order": "normalized", "strip_whitespace": "normalized", "drop_reasoning": "normalized",
            "byte_level_sample": "retokenized", "rewrite_history": "split"}

words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
commands = st.lists(words, min_size=1, max_size=4).map(" ".join)


class Sampler:
    """Returns scripted replies as token ids; ``byte_level`` samples a reply one byte-token at a time."""

    def __init__(self) -> None:
        self.next: tuple[str, bool] = ("", False)
        self.sampled: list[list[int]] = []
        self.logprobs: list[list[float]] = []

    def __call__(self, req):
        text, byte_level = self.next
        ids = RENDERER.encode(text)
        if byte_level:
            ids = [t for ch in text for t in RENDERER.encode(ch)]
        ids = ids + [IM_END_ID]
        lps = [-0.01 * (k + 1) for k in range(len(ids))]
        self.sampled.append(ids)
        self.logprobs.append(lps)
        return GenerateResponse(output_ids=tuple(ids), output_token_logprobs=tuple(lps),
                                finish_reason=FinishReason("stop"), weight_version="1",
                                prompt_tokens=len(req.input_ids), completion_tokens=len(ids))


def _reply_text(perturbation: str, command: str, note: str) -> tuple[str, bool]:
    # key order: the whole argument object differs, so keep it inside the repair window (< 17 tokens)
    args = {"command": command.split()[0], "timeout": 5} if perturbation == "key_order" else {"command": command}
    call = '<tool_call>\n{"name": "bash", "arguments": ' + json.dumps(args) + '}\n</tool_call>'
    if perturbation == "strip_whitespace":
        return f"{note}  \n{call}", False
    if perturbation == "drop_reasoning":
        return f"<think>\n{note}\n</think>\n\n{call}", False
    if perturbation in ("byte_level_sample", "rewrite_history"):
        # long enough that the harness's copy differs over more than the repair window (17 tokens)
        return f"{note} " * 40 + "\n" + call, perturbation == "byte_level_sample"
    return call, False


def _history_entry(perturbation: str, message: dict) -> dict:
    """The assistant message as the harness stores and re-sends it."""
    msg = {"role": "assistant", "content": message["content"] or "", "tool_calls": message["tool_calls"]}
    if message.get("reasoning_content") is not None:
        msg["reasoning_content"] = message["reasoning_content"]
    call = msg["tool_calls"][0]["function"]
    args = json.loads(call["arguments"])
    if perturbation == "compact_json":
        call["arguments"] = json.dumps(args, separators=(",", ":"))
    elif perturbation == "key_order":
        call["arguments"] = json.dumps(dict(reversed(list(args.items()))))
    elif perturbation == "strip_whitespace":
        msg["content"] = msg["content"].strip()
    elif perturbation == "drop_reasoning":
        msg.pop("reasoning_content", None)
    elif perturbation == "rewrite_history":
        msg["content"] = " ".join(f"step{i}" for i in range(30))
    elif perturbation == "reorder_fields":
        msg = {"tool_calls": msg["tool_calls"], "content": msg["content"], "role": "assistant"}
    return msg


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(perturbations=st.lists(st.sampled_from(sorted(EXPECTED)), min_size=1, max_size=3),
       cmds=st.lists(commands, min_size=3, max_size=3), note=words)
def test_perturbations_map_to_their_relation_and_loss_tokens_are_sampled_ids(perturbations, cmds, note):
    from rl.harness.openai_api import Completion  # noqa: F401  (the session's output type)

    sampler = Sampler()
    session = HarnessSession("p", sampler, RENDERER, SessionLimits(max_turns=8, max_new_tokens=1000,
                                                                    context_window=8000))
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    relations = []
    for k, pert in enumerate(perturbations + ["identity"]):
        sampler.next = _reply_text(pert, cmds[k % 3], note)
        out = session.complete(parse_request({"messages": messages, "tools": [BASH]}))
        relations.append(session.last_relation)
        msg = {"content": out.content, "tool_calls": out.tool_calls, "reasoning_content": out.reasoning}
        assert out.tool_calls and out.finish_reason == "tool_calls"
        messages.append(_history_entry(pert, msg))
        messages.append({"role": "tool", "tool_call_id": out.tool_calls[0]["id"], "content": "ok"})
    # turn k+1's relation is the one perturbation k called for
    assert relations[1:] == [EXPECTED[p] for p in perturbations]
    chunks = session.finish()
    for c in chunks:
        c.check_invariants()
    got = np.concatenate([c.tokens[c.loss_mask == 1] for c in chunks]).tolist()
    assert got == [i for ids in sampler.sampled for i in ids]
    got_lp = np.concatenate([c.rollout_logprobs[c.loss_mask == 1] for c in chunks])
    assert np.allclose(got_lp, [x for lps in sampler.logprobs for x in lps])
    assert len({c.meta["group_id"] for c in chunks}) == 1
