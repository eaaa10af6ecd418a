"""TITO data-contract invariants, with the real Qwen3.5 tokenizer.

Property tests build random multi-turn conversations (unicode, whitespace,
JSON arguments, empty outputs, stop-token text inside content) twice: token-in
(we own both ends) and harness mode (the harness re-renders parsed history).
Hand-built cases show real ids where encode(decode(ids)) != ids and which
relation catches each.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl.chat import (
    ENDOFTEXT_ID, IM_END_ID, ChatRenderer, parse_assistant, render_text,
)
from rl.errors import MissingRoutingError, RoutingError, TitoError
from rl.tito import (
    ALIGNED, PLACEHOLDER, RELATIONS, RETOKENIZED, TitoBuilder, Trajectory, find_normalized_repair,
)

L, K, E = 3, 2, 64
SYSTEM = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix it."}]


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer.default()


def row_of(ids: np.ndarray) -> np.ndarray:
    """A routing row that is a function of the token id, so row j <-> token j is checkable."""
    ids = np.asarray(ids, dtype=np.int64)
    return ((ids[:, None, None] * 7 + np.arange(L)[None, :, None] * 3 + np.arange(K)[None, None, :])
            % E).astype(np.int32)


def routing_for(seq: list[int], start: int) -> np.ndarray:
    return row_of(np.asarray(seq[start:len(seq) - 1], dtype=np.int64)).reshape(-1, L, K)


_text = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=24),
    st.sampled_from(["", " ", "\n\n", "  lead and trail  ", "<|im_end|>", "</tool_call>",
                     "naïve café ✓ 日本", "{\"json\": [1, 2]}", "\t"]))
_args = st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), _text, st.booleans()), max_size=3)
_call = st.builds(lambda n, a: {"function": {"name": n, "arguments": a}},
                  st.text("abcdefgh_", min_size=1, max_size=6), _args)
_turn = st.tuples(_text, st.lists(_call, max_size=2), st.lists(_text, min_size=1, max_size=2),
                  st.sampled_from([IM_END_ID, IM_END_ID, ENDOFTEXT_ID]))
_conv = st.lists(_turn, min_size=1, max_size=4)


def sampled_ids(renderer, content, calls, stop) -> list[int]:
    text = render_text([{"role": "assistant", "content": content, "tool_calls": calls}])
    body = text[len("<|im_start|>assistant\n"):-len("<|im_end|>\n")]
    return renderer.encode(body) + [stop]


def logprobs_for(ids) -> list[float]:
    return [-0.01 * (1 + i % 7) for i in range(len(ids))]


def assert_contract(chunks: list[Trajectory], gens: list[list[int]]) -> None:
    sampled = [t for g in gens for t in g]
    got = np.concatenate([c.tokens[c.loss_mask == 1] for c in chunks])
    assert got.tolist() == sampled  # loss-bearing positions bit-identical to sampled ids
    got_lp = np.concatenate([c.rollout_logprobs[c.loss_mask == 1] for c in chunks])
    assert np.allclose(got_lp, np.concatenate([logprobs_for(g) for g in gens]))
    for c in chunks:
        n = len(c)
        assert {a.shape[0] for a in (c.loss_mask, c.rollout_logprobs, c.engine_tokens, c.origin,
                                     c.policy_version, c.routing)} == {n}
        obs = c.loss_mask == 0
        assert not c.rollout_logprobs[obs].any() and (c.policy_version[obs] == -1).all()
        drift = c.tokens != c.engine_tokens
        assert not (drift & (c.loss_mask == 1)).any()  # drift set and loss region disjoint
        real = c.origin != PLACEHOLDER
        assert np.array_equal(c.routing[real], row_of(c.tokens[real]))  # row j is token j's
        assert c.meta["group_id"] == chunks[0].meta["group_id"]
        assert set(c.meta["relations"]) <= set(RELATIONS)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=_conv)
def test_token_in_mode_keeps_the_contract(renderer, conv):
    prompt = renderer.render_prompt(SYSTEM)
    b = TitoBuilder(prompt, sample_id="p", tokenizer=renderer.tokenizer, num_layers=L, topk=K)
    gens, start = [], 0
    for t, (content, calls, outputs, stop) in enumerate(conv):
        if t:
            b.add_observation(renderer.observation_ids([{"role": "tool", "content": o} for o in outputs],
                                                       gens[-1][-1]))
        gen = sampled_ids(renderer, content, calls, stop)
        seq = b.tokens + gen
        b.add_generation(gen, logprobs_for(gen), policy_version=t,
                         routing_rows=routing_for(seq, start), routing_start=start)
        start = len(seq) - 1  # the next request asks only for rows it does not have
        gens.append(gen)
    chunks = b.finish()
    assert len(chunks) == 1 and set(chunks[0].meta["relations"]) == {"strict"}
    assert (chunks[0].origin[:-1] == ALIGNED).all()
    assert chunks[0].origin[-1] == PLACEHOLDER  # the last sampled token is never routed by SGLang
    assert_contract(chunks, gens)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=_conv)
def test_harness_mode_rerendered_history_never_enters_the_stream(renderer, conv):
    """The harness persists parsed text and re-renders; the stream keeps the sampled ids."""
    history = list(SYSTEM)
    prompt = renderer.render_prompt(history)
    b = TitoBuilder(prompt, sample_id="h", tokenizer=renderer.tokenizer, num_layers=L, topk=K)
    gens = []
    for t, (content, calls, outputs, stop) in enumerate(conv):
        gen = sampled_ids(renderer, content, calls, stop)
        seq = prompt + gen
        relation = b.add_turn(prompt, gen, logprobs_for(gen), policy_version=t,
                              routing_rows=routing_for(seq, 0), routing_start=0)
        assert relation in RELATIONS
        gens.append(gen)
        history += [parse_assistant(renderer.decode(gen))] + [
            {"role": "tool", "content": o} for o in outputs]
        prompt = renderer.render_prompt(history)
    assert_contract(b.finish(), gens)


# --- hand-built encode(decode(ids)) != ids cases, real tokenizer -------------------
def _two_turns(renderer, gen: list[int], next_prompt_text_history: list[dict]):
    prompt = renderer.render_prompt(SYSTEM)
    b = TitoBuilder(prompt, sample_id="x", tokenizer=renderer.tokenizer)
    b.add_turn(prompt, gen, logprobs_for(gen), policy_version=0)
    p2 = renderer.render_prompt(next_prompt_text_history)
    rel = b.add_turn(p2, [IM_END_ID], [-0.1], policy_version=0)
    return rel, b.finish()


def _rerender_raw(renderer, gen):
    """The harness keeps the raw text (no parsing) but re-encodes it: encode(decode(ids))."""
    text = renderer.decode(gen[:-1])
    return SYSTEM + [{"role": "assistant", "content": text}, {"role": "tool", "content": "ok"}]


def test_noncanonical_bpe_split_is_caught_by_normalized(renderer):
    tok = renderer.tokenizer
    gen = tok.encode("say ") + tok.encode("hel") + tok.encode("lo") + [IM_END_ID]  # "hello" as 2 ids
    assert tok.encode(tok.decode(gen)) != gen
    rel, [c] = _two_turns(renderer, gen, _rerender_raw(renderer, gen))
    assert rel == "normalized" and c.meta["repairs"][0]["drop_stream"] >= 1
    assert c.accounting()["retokenized"] >= 1 and c.accounting()["drift_in_loss"] == 0


def test_special_token_spelled_in_pieces_is_caught_by_normalized(renderer):
    tok = renderer.tokenizer
    pieces = tok.encode("<|im_end|>", allowed_special=set())  # six ordinary ids
    gen = tok.encode("echo ") + pieces + [IM_END_ID]
    assert tok.encode(tok.decode(gen)) != gen  # re-encoding yields the special id 248046
    rel, [c] = _two_turns(renderer, gen, _rerender_raw(renderer, gen))
    assert rel == "normalized"
    assert c.tokens[c.loss_mask == 1].tolist() == gen + [IM_END_ID]


def test_far_apart_retokenizations_are_caught_by_retokenized(renderer):
    tok = renderer.tokenizer
    filler = tok.encode(" the" * 120)
    gen = tok.encode("hel") + tok.encode("lo") + filler + tok.encode("wor") + tok.encode("ld") + [IM_END_ID]
    assert tok.decode(tok.encode(tok.decode(gen))) == tok.decode(gen)  # same text, other ids
    rel, [c] = _two_turns(renderer, gen, _rerender_raw(renderer, gen))
    assert rel == "retokenized"
    acc = c.accounting()
    assert acc["retokenized"] >= 4 and acc["drift_in_loss"] == 0
    assert (c.origin[c.loss_mask == 1] == RETOKENIZED).sum() >= 4  # the re-split sampled ids
    assert c.tokens[c.loss_mask == 1].tolist() == gen + [IM_END_ID]


def test_nfd_text_changes_bytes_and_far_apart_forces_split(renderer):
    tok = renderer.tokenizer
    nfd = tok._tokenizer.encode_ordinary("e\u0301")  # decomposed é; encode() normalises to NFC
    filler = tok.encode(" the" * 120)
    gen = nfd + filler + nfd + [IM_END_ID]
    assert tok.encode(tok.decode(gen)) != gen
    rel, chunks = _two_turns(renderer, gen, _rerender_raw(renderer, gen))
    assert rel == "split" and [c.meta["chunk_id"] for c in chunks] == [0, 1]
    assert chunks[1].meta["group_id"] == chunks[0].meta["group_id"]
    assert chunks[0].tokens[chunks[0].loss_mask == 1].tolist() == gen


def test_nfd_single_site_is_normalized(renderer):
    tok = renderer.tokenizer
    gen = tok.encode("caf") + tok._tokenizer.encode_ordinary("e\u0301") + [IM_END_ID]
    rel, _ = _two_turns(renderer, gen, _rerender_raw(renderer, gen))
    assert rel == "normalized"


def test_repair_grid_is_bounded():
    stream = np.arange(300)
    prompt = np.concatenate([np.arange(10), np.full(5, -1), np.arange(200, 300), [7]])
    assert find_normalized_repair(stream, prompt) is None  # would need dropping 190 > 96 tokens
    prompt = np.concatenate([np.arange(10), np.full(16, -1), np.arange(100, 300), [7]])
    assert find_normalized_repair(stream, prompt) == (10, 90, 16)


# --- bad input ------------------------------------------------------------------------
def test_missing_routing_aborts_naming_the_trial(renderer):
    p = renderer.render_prompt(SYSTEM)
    b = TitoBuilder(p, sample_id="trial-42", num_layers=L, topk=K)
    with pytest.raises(MissingRoutingError, match="trial trial-42 turn 0"):
        b.add_generation([5, IM_END_ID], [-0.1, -0.1], policy_version=0, routing_rows=None)


def test_routing_for_wrong_token_count(renderer):
    p = renderer.render_prompt(SYSTEM)
    b = TitoBuilder(p, sample_id="s1", num_layers=L, topk=K)
    rows = routing_for(p + [5, IM_END_ID], 0)[:-1]
    with pytest.raises(RoutingError, match=r"sample s1 turn 0: routing has shape .*expected \("):
        b.add_generation([5, IM_END_ID], [-0.1, -0.1], policy_version=0, routing_rows=rows)


def test_row_in_no_capture_before_loss_tokens_raises(renderer):
    p = renderer.render_prompt(SYSTEM)
    b = TitoBuilder(p, sample_id="s5", num_layers=L, topk=K)
    gen = [5, IM_END_ID]
    b.add_generation(gen, [-0.1, -0.1], policy_version=0, routing_rows=routing_for(p + gen, 0))
    b.add_observation([7, 8])
    start = len(b.tokens)  # skips the rows of the stop token and the observation
    b.add_generation(gen, [-0.1, -0.1], policy_version=0,
                     routing_rows=routing_for(b.tokens + gen, start), routing_start=start)
    with pytest.raises(RoutingError, match="sample s5: 4 position.*no routing row.*3 of them"):
        b.finish()


def test_generation_without_stop_token(renderer):
    p = renderer.render_prompt(SYSTEM)
    b = TitoBuilder(p, sample_id="s2")
    b.add_generation([5, 6], [-0.1, -0.1], policy_version=0)
    with pytest.raises(TitoError, match="sample s2 turn 0: generation ended with id 6"):
        b.add_observation([1, 2])
    with pytest.raises(TitoError, match="2 output ids and 1 log-probs"):
        TitoBuilder(p, sample_id="s3").add_generation([5, 6], [-0.1], policy_version=0)


def test_invariant_check_catches_drift_in_loss_region():
    t = Trajectory(tokens=np.array([1, 2, 3]), loss_mask=np.array([0, 1, 1], np.int8),
                   rollout_logprobs=np.array([0, -1, -1], np.float32),
                   engine_tokens=np.array([1, 2, 4]), origin=np.zeros(3, np.int8),
                   policy_version=np.zeros(3, np.int32), routing=None, meta={"sample_id": "d"})
    with pytest.raises(TitoError, match="sample d: 1 loss-bearing position"):
        t.check_invariants()
    t.engine_tokens[2] = 3
    t.rollout_logprobs[0] = -0.5
    with pytest.raises(TitoError, match="non-zero rollout log-prob on an observation"):
        t.check_invariants()
