"""The batch-invariant engine (``engine.batch_invariant``, docs/determinism.md): with a sampling seed
per request, a request's tokens and log-probs are the same bit for bit whether it runs alone or
among others, in any order. Without the per-request seed the shared generator hands out random
streams in arrival order, so the same requests in another order sample other tokens: the seam the
campaign-level check (``t1ops chaos verify-recovery``) relies on, seen failing here."""
from __future__ import annotations

import threading

import pytest
import torch

from rl.engines import protocol as P
from rl.engines.embedded_engine import EmbeddedEngine
from rl.model import ModelSpec, build_policy, save_weights
from rl.vocab import CompactVocab

SPEC = ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_experts=8,
                 moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=192, vocab_size=300)
PROMPTS = [tuple(range(10, 40)) + (50 + i,) * (i + 1) for i in range(6)]  # a shared prefix, as a group's


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    import hashlib
    import json

    directory = tmp_path_factory.mktemp("ckpt")
    model = build_policy(SPEC, seed=1)
    with torch.no_grad():  # trained norm weights: not all representable in bf16 (a fresh init's 1.0 are)
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.linspace(0, 1e-3, param.numel()).view_as(param))
    path = save_weights(model, directory)
    (directory / "manifest.json").write_text(json.dumps(
        {"role": "actor", "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "step": 1}))
    return EmbeddedEngine(SPEC, CompactVocab.identity(SPEC.vocab_size), torch.bfloat16, 0, checkpoint=str(directory),
                          batch_invariant=True)


def _request(i: int, seeded: bool) -> P.GenerateRequest:
    params = P.SamplingParams(max_new_tokens=12, temperature=1.0, sampling_seed=1000 + i if seeded else None)
    return P.GenerateRequest(input_ids=PROMPTS[i], sampling_params=params, rid=f"r{i}", return_logprob=True)


def _one_at_a_time(engine, order, seeded):
    return {i: engine.generate(_request(i, seeded)) for i in order}


def _all_at_once(engine, order, seeded):
    out, threads = {}, []
    for i in order:
        threads.append(threading.Thread(target=lambda i=i: out.__setitem__(i, engine.generate(_request(i, seeded)))))
        threads[-1].start()
    for t in threads:
        t.join(timeout=120)
    return out


def _fingerprint(out):
    return {i: (r.output_ids, r.output_token_logprobs) for i, r in sorted(out.items())}


def test_seeded_requests_are_bit_identical_alone_or_batched_in_any_order(engine):
    alone = _fingerprint(_one_at_a_time(engine, range(6), seeded=True))
    assert _fingerprint(_all_at_once(engine, reversed(range(6)), seeded=True)) == alone
    assert _fingerprint(_all_at_once(engine, [2, 0, 5, 1, 4, 3], seeded=True)) == alone
    assert len({v[0] for v in alone.values()}) > 1  # it samples: different seeds, different tokens


def test_without_the_per_request_seed_the_order_changes_the_tokens(engine):
    engine._sampler.manual_seed(0)
    forward = _fingerprint(_one_at_a_time(engine, range(6), seeded=False))
    engine._sampler.manual_seed(0)
    backward = _fingerprint(_one_at_a_time(engine, reversed(range(6)), seeded=False))
    assert forward != backward  # the same requests, the same engine state, another arrival order


def test_an_engine_started_from_a_checkpoint_holds_what_a_weight_sync_would_give_it(engine):
    """A sync sends every tensor in the served dtype; megatron keeps norm weights fp32 in a bf16
    model, so a checkpoint load must round them too, or a resumed run's engines serve other weights."""
    from rl.model import weights_state_dict

    state = weights_state_dict(engine.model)
    above = {n: t for n, t in state.items() if t.dtype != torch.bfloat16}
    assert above, "the bf16 engine keeps some weights in fp32 (the case this guards)"
    assert all(torch.equal(t, t.to(torch.bfloat16).to(t.dtype)) for t in above.values())
