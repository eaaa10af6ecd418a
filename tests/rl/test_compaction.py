"""History compaction in the agent loop (rl.agent.compaction): a summary turn, then a new chunk.

A scripted policy stands in for the engine (real tokenizer, renderer and TITO); like an engine,
it refuses (HTTP 400) any request whose prompt + max_new_tokens exceeds the window.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rl.agent import budget
from rl.agent.compaction import LAST_OUTPUT_HEADER, SUMMARY_HEADER, SUMMARY_INSTRUCTION
from rl.agent.loop import AgentSettings, observation_text, run_episode, tool_call_text
from rl.chat import IM_END_ID, ChatRenderer
from rl.engines.protocol import FinishReason, GenerateResponse
from rl.errors import EngineError

L, K = 2, 2
CONTEXT = 640
SUMMARY = "SUMMARY: listed the files twice; nothing left to do."


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer.default()


def _engine(renderer, seen, *, turns_before_done=6, routing=True):
    """Tool calls until ``turns_before_done`` agent turns, then a final answer; a summary
    request (rid ``...-summaryN``) is answered with SUMMARY."""
    agent_turns = []

    def generate(req):
        if len(req.input_ids) + req.sampling_params.max_new_tokens > CONTEXT:
            raise EngineError(f"HTTP 400: prompt ({len(req.input_ids)}) + max_new_tokens "
                              f"({req.sampling_params.max_new_tokens}) exceeds the context window",
                              status_code=400)
        seen.append(req)
        if "-summary" in req.rid:
            text = SUMMARY
        else:
            agent_turns.append(req)
            text = "Done." if len(agent_turns) > turns_before_done else tool_call_text("ls -la /data")
        ids = (renderer.encode(text) + [IM_END_ID])[:req.sampling_params.max_new_tokens]
        rows = None
        if routing:
            n = len(req.input_ids) + len(ids) - 1 - req.routed_experts_start_len
            rows = np.arange(n * L * K, dtype=np.int32).reshape(n, L, K) % 8
        return GenerateResponse(output_ids=tuple(ids), output_token_logprobs=tuple([-0.25] * len(ids)),
                                finish_reason=FinishReason("stop"), weight_version="7",
                                prompt_tokens=len(req.input_ids), completion_tokens=len(ids),
                                routed_experts_RLK=rows)
    return generate


def _execute(command):
    """Tool output of ~60 tokens: several turns pass before the history needs compacting."""
    return SimpleNamespace(stdout="\n".join(f"file_{i:03d}.txt  4096 bytes" for i in range(4)), stderr="",
                           exit_code=0, reason="ok")


def _execute_short(command):
    return SimpleNamespace(stdout="file_000.txt", stderr="", exit_code=0, reason="ok")


def _settings(summary_max_new_tokens=64, **kw):
    return AgentSettings(max_turns=kw.pop("max_turns", 12), max_new_tokens=48, context_window=CONTEXT,
                         summary_max_new_tokens=summary_max_new_tokens, num_layers=L, topk=K, **kw)


def _run(renderer, settings, seen, execute=_execute, **kw):
    return run_episode("List the files in /data.", execute, _engine(renderer, seen, **kw), renderer, settings,
                       sample_id="s0", group_id="g0", prompt_id="t")


def test_compaction_summarises_and_continues_in_a_new_chunk(renderer):
    seen = []
    ep = _run(renderer, _settings(), seen)
    summaries = [r for r in seen if "-summary" in r.rid]
    assert ep.compactions >= 1 and ep.summary_failures == 0 and ep.end_reason == "done"
    assert len(ep.chunks) == ep.compactions + 1
    for r in seen:  # no request ever exceeds the window
        assert len(r.input_ids) + r.sampling_params.max_new_tokens <= CONTEXT
    first = summaries[0]
    assert first.sampling_params.max_new_tokens == 64
    assert renderer.decode(first.input_ids).rstrip().endswith(SUMMARY_INSTRUCTION + "<|im_end|>\n<|im_start|>assistant")
    # the summary turn is trainable: sampled ids with log-probs, version, routing, at the end of chunk 0
    c0, c1 = ep.chunks[0], ep.chunks[1]
    assert list(c0.tokens[:len(first.input_ids)]) == list(first.input_ids)
    tail = c0.tokens[len(first.input_ids):]
    assert renderer.decode(tail).startswith(SUMMARY)
    assert (c0.loss_mask[len(first.input_ids):] == 1).all()
    assert (c0.rollout_logprobs[len(first.input_ids):] == -0.25).all()
    assert (c0.policy_version[len(first.input_ids):] == 7).all()
    assert c0.routing.shape == (len(c0), L, K) and c1.routing.shape == (len(c1), L, K)
    # chunk 1 starts from system + task + summary + last output, and its next turn's prompt is that stream
    after = seen[seen.index(first) + 1]
    assert list(after.input_ids) == list(c1.tokens[:len(after.input_ids)]) and after.routed_experts_start_len == 0
    fresh = renderer.decode(after.input_ids)
    assert fresh.startswith("<|im_start|>system\n") and fresh.endswith("<|im_start|>assistant\n")
    assert "List the files in /data." in fresh and SUMMARY_HEADER in fresh and SUMMARY in fresh
    assert LAST_OUTPUT_HEADER in fresh and "file_003.txt" in fresh and SUMMARY_INSTRUCTION not in fresh
    assert {c.meta["group_id"] for c in ep.chunks} == {"g0"}
    for c in ep.chunks:
        c.check_invariants()


def test_trigger_comes_from_the_summary_request(renderer):
    """Compact at the last point where the summary request still fits after one more turn."""
    seen = []
    _run(renderer, _settings(), seen)
    first = next(r for r in seen if "-summary" in r.rid)
    instr = renderer.observation_ids([{"role": "user", "content": SUMMARY_INSTRUCTION}], IM_END_ID)
    obs = renderer.observation_ids([{"role": "tool", "content": observation_text(_execute("").stdout, "", 0, "ok")}],
                                   IM_END_ID)
    threshold = budget.compaction_threshold(CONTEXT, 48 + len(instr) + 64)
    history = len(first.input_ids) - len(instr)
    assert history + len(instr) + 64 <= CONTEXT          # the summary fits
    assert history + len(obs) > threshold                # and waiting one more turn might not have
    for r in seen[1:seen.index(first)]:                  # earlier decision points had room to wait
        assert len(r.input_ids) <= threshold


def test_compaction_off_keeps_context_exhausted(renderer):
    seen = []
    ep = _run(renderer, _settings(summary_max_new_tokens=0), seen)
    assert ep.end_reason == "context_exhausted" and ep.compactions == 0 and len(ep.chunks) == 1
    assert not [r for r in seen if "-summary" in r.rid]


def test_naive_reserve_overflows_and_the_summary_fails(renderer, monkeypatch):
    """The report's bug through the loop's seams: a reserve of its own, no fit check."""
    fit = budget.fit_generation

    def unchecked_summary(p, m, c, min_new_tokens=1, *, where=""):  # turns keep their fit check
        return budget.Budget(p, m, c, clamped=False) if "summary" in where else fit(p, m, c, min_new_tokens,
                                                                                    where=where)
    monkeypatch.setattr(budget, "compaction_threshold", lambda context, _reserve: context - 24)
    monkeypatch.setattr(budget, "fit_generation", unchecked_summary)
    seen = []
    ep = _run(renderer, _settings(max_turns=30), seen, execute=_execute_short, turns_before_done=100)
    assert ep.summary_failures == 1 and ep.end_reason == "summary_failed" and ep.compactions == 0
    assert len(ep.chunks) == 1  # the history up to the failure is kept, nothing continues
    assert not [r for r in seen if "-summary" in r.rid]  # the engine refused it


@pytest.mark.parametrize("instruction,summary_max_new", [("x " * 250, 300), ("List the files.", 600)])
def test_summary_that_cannot_fit_is_never_sent(renderer, instruction, summary_max_new):
    """A task prompt too long for a turn and a summary, or a summary request that leaves no room
    for a turn: counted, not sent, the episode ends."""
    seen = []
    ep = run_episode(instruction, _execute, _engine(renderer, seen), renderer,
                     _settings(summary_max_new_tokens=summary_max_new), sample_id="s1", group_id="g", prompt_id="t")
    assert ep.summary_failures == 1 and ep.end_reason == "summary_failed"
    assert all("-summary" not in r.rid for r in seen)


def test_engine_errors_other_than_refusal_propagate(renderer):
    def generate(req):
        if "-summary" in req.rid:
            raise EngineError("connection refused", status_code=None)
        return _engine(renderer, [])(req)

    with pytest.raises(EngineError, match="connection refused"):
        run_episode("List the files in /data.", _execute, generate, renderer, _settings(),
                    sample_id="s2", group_id="g", prompt_id="t")


def test_config_field_is_validated_and_reaches_the_agent():
    from t1ops.campaign.launch import _worker_settings
    from t1ops.config import parse_config
    from t1ops.errors import ConfigError

    with pytest.raises(ConfigError, match=r"summary_max_new_tokens \(1000\) \+ max_new_tokens \(64\) must be below"):
        parse_config({"rollout": {"summary_max_new_tokens": 1000, "context_window": 1024}})
    with pytest.raises(ConfigError, match="summary_max_new_tokens"):
        parse_config({"rollout": {"summary_max_new_tokens": -1}})
    cfg = parse_config({"rollout": {"summary_max_new_tokens": 96}})
    assert _worker_settings(cfg).agent.summary_max_new_tokens == 96
    assert parse_config({}).rollout.summary_max_new_tokens == 0  # off by default


def test_step_summary_counts_compactions_and_failed_summaries():
    from t1ops.campaign.runner import _metrics_row
    from t1ops.campaign.trials import TrialResult

    row = TrialResult(task="t", group_id="g", sample_id="g-s0", reward=0.0, num_turns=3, total=1, passed=0,
                      reward_source="ctrf", end_reason="done")
    results = [row.replace(compactions=2, summary_failures=0),
               row.replace(compactions=0, summary_failures=1, end_reason="summary_failed"), row]
    from t1ops.campaign.credit import assign_credit
    from t1ops.campaign.reward_policy import RewardPolicy
    from t1ops.campaign.roles import TrainReport

    out = _metrics_row(1, results, assign_credit(results, RewardPolicy()), TrainReport(skipped="test"),
                       1.0, 1.0, 2.0, 0.0)
    assert out["compactions"] == 2 and out["summary_failures"] == 1
    assert out["end_reasons"] == {"done": 2, "summary_failed": 1}
