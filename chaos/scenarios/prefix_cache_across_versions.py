"""prefix-cache-across-versions: cached K/V of the old weights reused after a weight update.

SkyRL issue #1836 (github.com/NovaSky-AI/SkyRL/issues/1836): the prefix cache's key hashes the token
content only, so after a weight sync a request whose prompt extends a cached prefix reused K/V the
old weights computed; its log-probs belong to neither policy, and nothing errors.

Fault (real): an in-process embedded engine with the production scheduler (K/V cache, continuous
batching, prefix reuse) serves a turn, loads new weights through the weight-update path
(``rl.engines.weight_updates.load_partial``, what ``/update_weights_from_distributed`` runs), then
serves the next turn of the same trajectory (its prompt extends the first turn's stream, so it takes
over the cached slot).

- Unguarded (a cache keyed on token content only): the scheduler is told nothing changed (its
  weights generation left equal to the engine's, which is what a token-only key amounts to); the
  second turn reuses the old K/V and its log-probs differ from a full forward of the new weights.
- Guarded: every load bumps ``weights_generation``; the scheduler drops the retained prefixes at its
  next iteration (``BatchScheduler._on_new_weights``) and re-prefills, so the second turn's log-probs
  equal the full forward's (t1ops is immune by design).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from chaos.harness import Guarded, Outcome, Timeline, register
from rl.engines import protocol as P

PROMPT = tuple(range(3, 27))   # 24 tokens: longer than the scheduler's minimum shared prefix
NEW_TOKENS = 4


def spec():
    from rl.model import ModelSpec
    return ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=32,
                     num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=96, vocab_size=128)


def inproc_engine(seed: int = 7, **kw):
    """A production embedded engine in this process (float32, identity vocab), scheduler running."""
    from rl.engines.embedded_engine import EmbeddedEngine
    from rl.megatron_cpu import init_single_process
    from rl.vocab import CompactVocab
    init_single_process()
    s = spec()
    return EmbeddedEngine(s, CompactVocab.identity(s.vocab_size), torch.float32, seed, weight_version="1", **kw)


def new_weights(engine, seed: int) -> dict[str, torch.Tensor]:
    """The engine's tensors, each moved by a seeded perturbation (a training step's worth)."""
    from rl.model import weights_state_dict
    gen = torch.Generator().manual_seed(seed)
    return {n: t.detach().clone() + 0.2 * torch.randn(t.shape, generator=gen) for n, t in
            weights_state_dict(engine.model).items()}


def load(engine, state: dict[str, torch.Tensor], version: str) -> None:
    """The distributed update's load step (``rl.engines.weight_updates``), then the version."""
    from rl.engines.weight_updates import load_partial
    load_partial(engine, state)
    with engine.model_lock:
        engine.weight_version = version


def greedy(engine, ids, rid: str) -> P.GenerateResponse:
    return engine.generate(P.GenerateRequest(input_ids=tuple(ids), rid=rid, return_logprob=True,
                                             sampling_params=P.SamplingParams(max_new_tokens=NEW_TOKENS,
                                                                              temperature=0.0)))


def full_forward_gap(engine, ids, resp: P.GenerateResponse) -> float:
    """max |engine log-prob - a full forward of the served weights| over the response's tokens."""
    from rl.model import token_logprobs
    seq = list(ids) + list(resp.output_ids)
    with torch.no_grad(), engine.model_lock:
        ref = token_logprobs(engine.model, torch.tensor([seq[:-1]]), torch.tensor([seq[1:]]))[0][-len(resp.output_ids):]
    return float(np.max(np.abs(np.asarray(resp.output_token_logprobs) - ref.numpy())))


def _two_turns(token_only_key: bool) -> dict:
    engine = inproc_engine()
    first = greedy(engine, PROMPT, "turn-1")
    state = new_weights(engine, seed=1)
    t_load = time.monotonic()
    load(engine, state, "2")
    if token_only_key:  # the scheduler never learns the weights changed
        engine.scheduler._weights_seen = engine.weights_generation
    reused_before = engine.scheduler.pool.reused_tokens
    second_ids = list(PROMPT) + list(first.output_ids) + [5, 9]
    second = greedy(engine, second_ids, "turn-2")
    served_s = time.monotonic() - t_load
    engine.close()
    return {"reused": engine.scheduler.pool.reused_tokens - reused_before, "gap": full_forward_gap(engine, second_ids, second),
            "version": second.weight_version, "served_s": served_s, "t_load": t_load, "t_served": t_load + served_s}


@register("prefix-cache-across-versions", "a prefix cache keyed on tokens reuses K/V across a weight update")
def run(tmp: Path) -> Outcome:
    bad = _two_turns(token_only_key=True)
    good = _two_turns(token_only_key=False)
    tl = Timeline()
    tl.fault(good["t_load"])
    tl.detected(good["t_served"])
    tl.healthy(good["t_served"])
    return Outcome(
        fault_fired=bad["reused"] > 0,
        unguarded=(f"cache keyed on tokens only: the second turn reused {bad['reused']} cached positions computed "
                   f"by version 1 and was served as version {bad['version']}; its log-probs differ from a full "
                   f"forward of the new weights by up to {bad['gap']:.3g}, no error"),
        guarded=Guarded(caught=good["gap"] < 1e-4, detection_s=good["served_s"],
                        error=f"weights_generation bumped by the load: retained prefixes dropped, the second turn "
                              f"re-prefilled (log-prob gap {good['gap']:.2g})"),
        invariants={
            "unguarded_stale_kv_changes_logprobs": bad["reused"] > 0 and bad["gap"] > 1e-3,
            "guarded_matches_a_full_forward_of_the_new_weights": good["gap"] < 1e-4,
            "guarded_reused_no_old_kv": good["reused"] == 0,
            "served_at_the_new_version": good["version"] == "2",
        },
        details={"unguarded": {k: v for k, v in bad.items() if not k.startswith("t_")},
                 "guarded": {k: v for k, v in good.items() if not k.startswith("t_")}},
        recovery=tl.recovery(how="in place: the next scheduler iteration drops the old K/V"))
