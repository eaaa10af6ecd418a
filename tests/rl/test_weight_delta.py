"""rl.weights.delta: a delta turns the base into the new tensors bit for bit, sends the cheapest
encoding, and refuses what does not fit (docs/weights.md, "Delta sync")."""
from __future__ import annotations

import pytest
import torch

from rl.errors import CheckpointError
from rl.model import ModelSpec, build_policy, weights_state_dict
from rl.weights import delta
from rl.weights.buckets import hf_buckets, hf_delta_buckets

SPEC = ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=32,
                 num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=64, vocab_size=256)


def _roundtrip(new, old, name="w"):
    entries = [(name, kind, t) for kind, t in delta.encode(new, old)]
    return entries, delta.apply(entries, {name: old}).get(name, old)


def test_few_changed_elements_go_sparse_and_apply_bit_exactly():
    old = torch.randn(64, 32).to(torch.bfloat16)
    new = old.clone()
    new[3, 5], new[40, 0] = new[3, 5] * 2, -0.0  # -0.0 differs from 0.0 by its bits
    entries, got = _roundtrip(new, old)
    assert [k for _, k, _ in entries] == ["index", "value"] and entries[0][2].tolist()[0] == 3 * 32 + 5
    assert torch.equal(delta.bits(got), delta.bits(new))


def test_an_unchanged_tensor_sends_nothing_and_a_mostly_changed_one_goes_dense():
    old = torch.randn(16, 16)
    assert delta.encode(old.clone(), old) == []
    entries, got = _roundtrip(old + 1, old)
    assert [k for _, k, _ in entries] == ["dense"] and torch.equal(got, old + 1)


def test_a_malformed_delta_is_refused_by_name():
    old = torch.zeros(8)
    with pytest.raises(CheckpointError, match="outside"):
        delta.apply([("w", "index", torch.tensor([9], dtype=torch.int32)), ("w", "value", torch.ones(1))], {"w": old})
    with pytest.raises(CheckpointError, match="expected an index entry followed by its value"):
        delta.apply([("w", "value", torch.ones(1))], {"w": old})
    with pytest.raises(CheckpointError, match="base version '3' was refused.*holds version '2'"):
        delta.check_base("3", "2", "here")


def test_delta_buckets_carry_only_changed_units_and_rebuild_the_full_state():
    state = weights_state_dict(build_policy(SPEC, seed=1))
    new = {k: v.clone() for k, v in state.items()}
    name = next(k for k in new if "linear_qkv.weight" in k)
    new[name][0, 0] += 1.0  # one element of one fused unit: only its q_proj piece moves
    buckets = hf_delta_buckets(new, state, SPEC, torch.float32, bucket_bytes=1 << 20)
    (bucket, tensors), = buckets
    assert bucket.kinds == ("index", "value") and bucket.names[0].endswith("q_proj.weight")
    assert bucket.num_bytes == 8 and hf_delta_buckets(state, state, SPEC, torch.float32, 1 << 20) == []
    full = sum(b.num_bytes for b, _ in hf_buckets(new, SPEC, torch.float32, 1 << 20))
    assert bucket.num_bytes < full / 1000


def test_the_request_carries_a_delta_only_when_it_is_one():
    from rl.engines import protocol_weights as PW
    from rl.errors import ParseError

    full = PW.UpdateWeightsFromDistributedRequest(names=("a",), dtypes=("bfloat16",), shapes=((2,),))
    assert "delta_base" not in full.to_json() and "delta_kinds" not in full.to_json()  # SGLang's payload
    d = PW.UpdateWeightsFromDistributedRequest(names=("a", "a"), dtypes=("int32", "bfloat16"), shapes=((1,), (1,)),
                                               delta_base="3", delta_kinds=("index", "value"))
    assert PW.UpdateWeightsFromDistributedRequest.from_json(d.to_json()) == d
    with pytest.raises(ParseError, match="come together"):
        PW.UpdateWeightsFromDistributedRequest(names=("a",), dtypes=("f",), shapes=((1,),), delta_base="3")
    with pytest.raises(ParseError, match="one of dense/index/value per name"):
        PW.UpdateWeightsFromDistributedRequest(names=("a",), dtypes=("f",), shapes=((1,),), delta_base="3",
                                               delta_kinds=("xor",))
