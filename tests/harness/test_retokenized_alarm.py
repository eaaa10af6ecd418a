"""health.retokenized through the endpoint's real path (docs/failures.md, "Every alarm on a real run").

No campaign on this host can raise the share: the builtin agent is token-in (the next prompt is the
stream, strict by construction) and the tiny harness campaign's policy ends every trajectory after
one turn (no later prompt is ever related to the stream). So the trials here go through the real
OpenAI-endpoint session (template, parser, TITO relations) with a scripted sampler in place of the
engine: for two steps the sampler emits each reply's canonical tokens (the harness's re-rendered
history re-encodes to them: strict); from step 3 a degraded policy samples the same text one byte
token at a time, so the harness's re-encoded copy differs (retokenized). The results are staged as the
object-store data plane stages them (``loss_relations``) and the step rows checked by ``RunHealth``."""
from __future__ import annotations

from rl.chat import IM_END_ID, ChatRenderer
from rl.engines.protocol import FinishReason, GenerateResponse
from rl.harness.openai_api import parse_request
from rl.harness.session import HarnessSession, SessionLimits
from t1ops.campaign.dataplane import loss_relations
from t1ops.campaign.trials import TrialResult
from t1ops.guards.field_config import RunHealthConfig
from t1ops.guards.run_health import RunHealth

RENDERER = ChatRenderer.default()
BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}


def _trial(sample: str, byte_level: bool) -> list:
    """A two-turn trajectory of a harness that keeps its history as parsed messages."""
    def sampler(req):
        text = f"listing {sample} " * 12 + '\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
        ids = [t for ch in text for t in RENDERER.encode(ch)] if byte_level else RENDERER.encode(text)
        ids = [*ids, IM_END_ID]
        return GenerateResponse(output_ids=tuple(ids), output_token_logprobs=tuple([-0.1] * len(ids)),
                                finish_reason=FinishReason("stop"), weight_version="1",
                                prompt_tokens=len(req.input_ids), completion_tokens=len(ids))

    session = HarnessSession(sample, sampler, RENDERER, SessionLimits(max_turns=4, max_new_tokens=2000,
                                                                       context_window=16000))
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "list the files"}]
    for _ in range(2):
        out = session.complete(parse_request({"messages": messages, "tools": [BASH]}))
        messages += [{"role": "assistant", "content": out.content or "", "tool_calls": out.tool_calls},
                     {"role": "tool", "tool_call_id": out.tool_calls[0]["id"], "content": "a.txt"}]
    return session.finish()


def test_a_policy_sampling_non_canonical_tokens_fires_retokenized_at_that_step():
    health, fired, shares = RunHealth(RunHealthConfig()), [], []
    for step in (1, 2, 3):
        results = []
        for i in range(4):
            chunks = _trial(f"s{step}-{i}", byte_level=step == 3)
            results.append(TrialResult(group_id=f"g{i // 2}", task="t", sample_id=f"s{step}-{i}", reward=i % 2,
                                       end_reason="done", loss_relations=loss_relations(chunks)))
        row = {"step": step, "rollout_s": 1.0, "train_s": 1.0, "sync_s": 1.0}
        out = health.check(row, results)
        fired.append(out["health_alarms"])
        shares.append(out["health"]["retokenized"])
    assert shares[0] == shares[1] == 0.0 and shares[2] > 0.05, shares
    assert fired == [[], [], ["health.retokenized"]], (fired, shares)
