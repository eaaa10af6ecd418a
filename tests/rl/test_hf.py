"""The Hugging Face export against transformers' own Qwen3-MoE (an implementation nobody here wrote).

Equivalence: on a batch, fp32 logits of ``Qwen3MoeForCausalLM`` loaded from the export match the
megatron-core policy within atol 1e-4 (differences are float summation order only: same math,
different kernels), and the top-k expert ids of every token in every layer are identical.
Round trip: export -> import is bit-exact. Tokenizer: the exported tokenizer.json encodes like
the campaign's tokenizer.
"""
from __future__ import annotations

import json

import pytest
import torch

from rl.errors import CheckpointError, CheckpointRoleError
from rl.hf import layout
from rl.hf.checkpoint import check_actor_export, export_hf, import_hf
from rl.model import ModelSpec, build_policy, policy_forward, record_routing, weights_state_dict

SPEC = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=128,
                 num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=64, vocab_size=300)
LOGIT_ATOL = 1e-4


def _policy(seed: int = 3):
    policy = build_policy(SPEC, seed, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # norms start at 1: perturb every tensor so a swapped map cannot pass
        for name, p in policy.named_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen) * (1.0 if "norm" in name else 0.2))
    return policy.eval()


def _hf_routing(model):
    """Per layer, the top-k expert ids transformers' router picked in the last forward."""
    picked, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.mlp.gate.register_forward_hook(
            lambda _m, _a, out, i=i: picked.__setitem__(i, out[2].detach().clone())))
    return picked, hooks


def test_transformers_logits_and_routing_match_megatron(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3MoeForCausalLM

    policy = _policy()
    export_hf(weights_state_dict(policy), SPEC, tmp_path / "hf", tokenizer=False, meta={"role": "actor"})
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32, attn_implementation="eager")
    assert isinstance(hf, Qwen3MoeForCausalLM)
    hf.eval()
    ids_BT = torch.randint(0, SPEC.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), record_routing(policy) as rec:
        mcore_BTV = policy_forward(policy, ids_BT).float()
    picked, hooks = _hf_routing(hf)
    try:
        with torch.no_grad():
            hf_BTV = hf(input_ids=ids_BT).logits.float()
    finally:
        for h in hooks:
            h.remove()
    assert hf_BTV.shape == mcore_BTV.shape
    err = (hf_BTV - mcore_BTV).abs().max().item()
    print(f"max |logit difference| megatron vs transformers: {err:.3e}")
    assert err < LOGIT_ATOL, f"max |logit difference| {err:.2e} >= {LOGIT_ATOL}"
    assert mcore_BTV.std() > 0.1  # the comparison is not between two near-constant outputs
    for layer in range(SPEC.num_layers):  # HF routes flattened [B*T] tokens batch-major
        hf_BTK = picked[layer].view(3, 24, SPEC.moe_router_topk).sort(-1).values
        mcore_BTK = torch.stack([torch.from_numpy(r[:, layer]) for r in rec.rows]).long().sort(-1).values
        assert torch.equal(hf_BTK, mcore_BTK), f"layer {layer}: expert ids differ"


def test_export_import_round_trip_is_bit_exact(tmp_path):
    state = weights_state_dict(_policy(5))
    export_hf(state, SPEC, tmp_path / "hf", tokenizer=False, meta={"role": "actor", "step": 7})
    spec, back = import_hf(tmp_path / "hf")
    assert spec == SPEC and set(back) == set(state)
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    assert json.loads((tmp_path / "hf" / "t1ops.json").read_text())["step"] == 7


def test_map_is_a_bijection_with_exact_shapes():
    state = weights_state_dict(_policy(1))
    hf = layout.to_hf(state, SPEC)
    assert {k: tuple(v.shape) for k, v in hf.items()} == layout.hf_shapes(SPEC)
    assert len({n for u in layout.units(SPEC) for n in u.hf}) == len(hf)
    back = layout.from_hf(hf, SPEC)
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_import_refuses_wrong_shapes_partial_units_and_other_roles(tmp_path):
    state = weights_state_dict(_policy(2))
    hf = layout.to_hf(state, SPEC)
    with pytest.raises(CheckpointError, match="missing"):
        layout.from_hf({"model.layers.0.self_attn.q_proj.weight": hf["model.layers.0.self_attn.q_proj.weight"]},
                          SPEC, partial=True)
    with pytest.raises(CheckpointError, match="not part of"):
        layout.from_hf({"model.layers.9.mlp.gate.weight": torch.zeros(1)}, SPEC, partial=True)
    with pytest.raises(CheckpointError, match="wrong shape"):
        layout.check_shapes({"lm_head.weight": torch.zeros(3, 64)}, SPEC)
    export_hf(state, SPEC, tmp_path / "critic", tokenizer=False, meta={"role": "critic"})
    with pytest.raises(CheckpointRoleError):
        check_actor_export(tmp_path / "critic")
    with pytest.raises(CheckpointError, match="not empty"):
        export_hf(state, SPEC, tmp_path / "critic", tokenizer=False)


def test_exported_tokenizer_encodes_like_the_campaign_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from rl.chat import IM_START_ID, load_tokenizer
    from rl.hf.tokenizer import write_tokenizer

    write_tokenizer(tmp_path)
    fast, ours = AutoTokenizer.from_pretrained(tmp_path), load_tokenizer()
    for text in ["<|im_start|>user\nls -la | grep foo\n\n<tool_call>{\"a\": 1}</tool_call><|im_end|>",
                 "Ünïcödé 12345 的中文  tabs\tand\r\nnewlines", "e\u0301 (NFD) vs \u00e9"]:
        assert fast.encode(text, add_special_tokens=False) == list(ours.encode(text)), text
    assert fast.convert_tokens_to_ids("<|im_start|>") == IM_START_ID
