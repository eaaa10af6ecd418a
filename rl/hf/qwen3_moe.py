"""The exact map between the megatron-core policy (:mod:`rl.model`) and ``Qwen3MoeForCausalLM``.

Names (L = layer, E = expert; megatron left, Hugging Face checkpoint right)::

    embedding.word_embeddings.weight                      model.embed_tokens.weight
    decoder.layers.L.input_layernorm.weight               model.layers.L.input_layernorm.weight
    decoder.layers.L.self_attention.linear_qkv.weight     model.layers.L.self_attn.{q,k,v}_proj.weight  (split)
    decoder.layers.L.self_attention.q_layernorm.weight    model.layers.L.self_attn.q_norm.weight
    decoder.layers.L.self_attention.k_layernorm.weight    model.layers.L.self_attn.k_norm.weight
    decoder.layers.L.self_attention.linear_proj.weight    model.layers.L.self_attn.o_proj.weight
    decoder.layers.L.pre_mlp_layernorm.weight             model.layers.L.post_attention_layernorm.weight
    decoder.layers.L.mlp.router.weight                    model.layers.L.mlp.gate.weight
    decoder.layers.L.mlp.experts.local_experts.E.linear_fc1.weight
                                                          model.layers.L.mlp.experts.E.{gate,up}_proj.weight (split)
    decoder.layers.L.mlp.experts.local_experts.E.linear_fc2.weight
                                                          model.layers.L.mlp.experts.E.down_proj.weight
    decoder.final_layernorm.weight                        model.norm.weight
    output_layer.weight                                   lm_head.weight

Layouts: megatron's fused ``linear_qkv`` is grouped by query group, ``[G, (H/G + 2), D, hidden]``
(the group's H/G query heads, then its key head, then its value head); Hugging Face keeps
``q_proj`` ``[H*D, hidden]``, ``k_proj``/``v_proj`` ``[G*D, hidden]``. megatron's SwiGLU
``linear_fc1`` is ``[gate; up]`` stacked on dim 0. The checkpoint uses the per-expert names
Qwen3-MoE checkpoints ship with (SGLang's loader reads them; ``transformers`` 5 fuses them into
``experts.gate_up_proj`` on load). Every conversion is a reshape/split/concat: bit-exact both ways.

A :class:`Unit` is one megatron tensor and the Hugging Face tensors it becomes; a weight transfer
that is split into buckets never splits a unit, so each bucket converts on its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import torch

from rl.errors import CheckpointError, InputError
from rl.model import RMS_NORM_EPS, ROPE_THETA, ModelSpec

ARCHITECTURE = "Qwen3MoeForCausalLM"
MODEL_TYPE = "qwen3_moe"


def head_dim(spec: ModelSpec) -> int:
    return spec.hidden_size // spec.num_attention_heads


def config_dict(spec: ModelSpec, torch_dtype: str = "float32", bos_token_id: int | None = None,
                eos_token_id: int | None = None) -> dict:
    """``config.json`` of the Qwen3-MoE model equal to ``spec`` (every layer sparse, no shared expert)."""
    if spec.hidden_size % spec.num_attention_heads:
        raise InputError(f"hidden_size ({spec.hidden_size}) must be a multiple of num_attention_heads "
                         f"({spec.num_attention_heads})", hidden_size=spec.hidden_size)
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_hidden_size, "moe_intermediate_size": spec.moe_ffn_hidden_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_query_groups, "head_dim": head_dim(spec),
        "num_experts": spec.num_experts, "num_experts_per_tok": spec.moe_router_topk,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "hidden_act": "silu", "rms_norm_eps": RMS_NORM_EPS, "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "max_position_embeddings": spec.max_seq_len, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "use_cache": True, "output_router_logits": False,
        "router_aux_loss_coef": 0.0, "use_sliding_window": False, "sliding_window": None,
        "initializer_range": 0.02, "torch_dtype": torch_dtype, "dtype": torch_dtype,
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id,
    }


def spec_from_config(config: Mapping) -> ModelSpec:
    """The :class:`ModelSpec` of a Qwen3-MoE ``config.json``; refuses what the tiny model cannot express."""
    where = "config.json"
    if config.get("model_type") != MODEL_TYPE:
        raise CheckpointError(f"{where}: model_type {config.get('model_type')!r} is not {MODEL_TYPE!r}")
    expected = {"norm_topk_prob": True, "decoder_sparse_step": 1, "hidden_act": "silu",
                "attention_bias": False, "tie_word_embeddings": False}
    wrong = {k: config.get(k, v if k != "norm_topk_prob" else False) for k, v in expected.items()
             if config.get(k, v) != v}
    if config.get("mlp_only_layers"):
        wrong["mlp_only_layers"] = config["mlp_only_layers"]
    heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    if int(config.get("head_dim", hidden // heads)) != hidden // heads:
        wrong["head_dim"] = config["head_dim"]
    if wrong:
        raise CheckpointError(f"{where}: {wrong} differ from the layout rl.model builds ({expected}, "
                              "head_dim = hidden_size / num_attention_heads, no dense layers)", fields=sorted(wrong))
    return ModelSpec(num_layers=int(config["num_hidden_layers"]), hidden_size=hidden, num_attention_heads=heads,
                     ffn_hidden_size=int(config["intermediate_size"]), num_experts=int(config["num_experts"]),
                     moe_router_topk=int(config["num_experts_per_tok"]),
                     moe_ffn_hidden_size=int(config["moe_intermediate_size"]),
                     max_seq_len=int(config["max_position_embeddings"]), vocab_size=int(config["vocab_size"]),
                     num_query_groups=int(config["num_key_value_heads"]))


@dataclass(frozen=True)
class Unit:
    """One megatron tensor <-> its Hugging Face tensors (``split`` then ``merge`` is the identity)."""

    mcore: str
    hf: tuple[str, ...]
    split: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    merge: Callable[[tuple[torch.Tensor, ...]], torch.Tensor]


def _same(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (t,)


def _one(ts: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return ts[0]


def _qkv_split(spec: ModelSpec):
    groups, per_group, dim = spec.num_query_groups, spec.num_attention_heads // spec.num_query_groups, head_dim(spec)

    def split(qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        w = qkv.reshape(groups, per_group + 2, dim, -1)
        hidden = w.shape[-1]
        return (w[:, :per_group].reshape(groups * per_group * dim, hidden).contiguous(),
                w[:, per_group].reshape(groups * dim, hidden).contiguous(),
                w[:, per_group + 1].reshape(groups * dim, hidden).contiguous())

    def merge(qkv: tuple[torch.Tensor, ...]) -> torch.Tensor:
        q, k, v = qkv
        hidden = q.shape[-1]
        w = torch.cat([q.reshape(groups, per_group, dim, hidden), k.reshape(groups, 1, dim, hidden),
                       v.reshape(groups, 1, dim, hidden)], dim=1)
        return w.reshape(groups * (per_group + 2) * dim, hidden).contiguous()

    return split, merge


def _swiglu_split(fc1: torch.Tensor) -> tuple[torch.Tensor, ...]:
    gate, up = fc1.chunk(2, dim=0)
    return gate.contiguous(), up.contiguous()


def _swiglu_merge(gate_up: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.cat(gate_up, dim=0).contiguous()


def units(spec: ModelSpec) -> list[Unit]:
    """Every conversion unit of ``spec``'s policy, in checkpoint order."""
    qkv_split, qkv_merge = _qkv_split(spec)
    out = [Unit("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), _same, _one)]
    for layer in range(spec.num_layers):
        m, h = f"decoder.layers.{layer}.", f"model.layers.{layer}."
        out += [
            Unit(m + "input_layernorm.weight", (h + "input_layernorm.weight",), _same, _one),
            Unit(m + "self_attention.linear_qkv.weight",
                 tuple(h + f"self_attn.{p}_proj.weight" for p in "qkv"), qkv_split, qkv_merge),
            Unit(m + "self_attention.q_layernorm.weight", (h + "self_attn.q_norm.weight",), _same, _one),
            Unit(m + "self_attention.k_layernorm.weight", (h + "self_attn.k_norm.weight",), _same, _one),
            Unit(m + "self_attention.linear_proj.weight", (h + "self_attn.o_proj.weight",), _same, _one),
            Unit(m + "pre_mlp_layernorm.weight", (h + "post_attention_layernorm.weight",), _same, _one),
            Unit(m + "mlp.router.weight", (h + "mlp.gate.weight",), _same, _one),
        ]
        for e in range(spec.num_experts):
            me, he = m + f"mlp.experts.local_experts.{e}.", h + f"mlp.experts.{e}."
            out += [Unit(me + "linear_fc1.weight", (he + "gate_proj.weight", he + "up_proj.weight"),
                         _swiglu_split, _swiglu_merge),
                    Unit(me + "linear_fc2.weight", (he + "down_proj.weight",), _same, _one)]
    out += [Unit("decoder.final_layernorm.weight", ("model.norm.weight",), _same, _one),
            Unit("output_layer.weight", ("lm_head.weight",), _same, _one)]
    return out


def to_hf(state: Mapping[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """megatron state (``rl.model.weights_state_dict``) -> Hugging Face checkpoint tensors."""
    all_units = units(spec)
    wrong = sorted(set(state) ^ {u.mcore for u in all_units})
    if wrong:
        raise CheckpointError(f"state does not match the policy of this ModelSpec: {len(wrong)} name(s) differ "
                              f"(first: {wrong[:3]}): a critic, another ModelSpec, or a policy saved before the Qwen3-MoE layout "
                              "(LayerNorm with biases, no q/k norm), which has no exact Hugging Face equivalent",
                              mismatched=wrong[:10])
    out: dict[str, torch.Tensor] = {}
    for unit in all_units:
        out.update(zip(unit.hf, unit.split(state[unit.mcore])))
    return out


def from_hf(hf_state: Mapping[str, torch.Tensor], spec: ModelSpec, *, partial: bool = False) -> dict[str, torch.Tensor]:
    """Hugging Face tensors -> megatron state. ``partial``: convert only the units ``hf_state`` covers.

    A unit given in part (``q_proj`` without ``k_proj``), or a name that belongs to no unit, raises.
    """
    all_units = units(spec)
    known = {name for u in all_units for name in u.hf}
    unknown = sorted(set(hf_state) - known)
    if unknown:
        raise CheckpointError(f"{len(unknown)} tensor name(s) are not part of the Qwen3-MoE layout of this "
                              f"ModelSpec (first: {unknown[:3]})", unknown=unknown[:10])
    out: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    for unit in all_units:
        present = [name in hf_state for name in unit.hf]
        if all(present):
            out[unit.mcore] = unit.merge(tuple(hf_state[name] for name in unit.hf))
        elif any(present) or not partial:
            missing += [name for name, here in zip(unit.hf, present) if not here]
    if missing:
        raise CheckpointError(f"{len(missing)} Hugging Face tensor(s) missing (first: {missing[:3]}); a weight "
                              "update must carry every tensor of a unit", missing=missing[:10])
    return out


def hf_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Expected shape of every Hugging Face tensor (for checking an import before converting)."""
    dim, hidden = head_dim(spec), spec.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, hidden),
                                          "model.norm.weight": (hidden,), "lm_head.weight": (spec.vocab_size, hidden)}
    for layer in range(spec.num_layers):
        h = f"model.layers.{layer}."
        shapes.update({h + "input_layernorm.weight": (hidden,), h + "post_attention_layernorm.weight": (hidden,),
                       h + "self_attn.q_proj.weight": (spec.num_attention_heads * dim, hidden),
                       h + "self_attn.k_proj.weight": (spec.num_query_groups * dim, hidden),
                       h + "self_attn.v_proj.weight": (spec.num_query_groups * dim, hidden),
                       h + "self_attn.o_proj.weight": (hidden, spec.num_attention_heads * dim),
                       h + "self_attn.q_norm.weight": (dim,), h + "self_attn.k_norm.weight": (dim,),
                       h + "mlp.gate.weight": (spec.num_experts, hidden)})
        for e in range(spec.num_experts):
            he = h + f"mlp.experts.{e}."
            shapes.update({he + "gate_proj.weight": (spec.moe_ffn_hidden_size, hidden),
                           he + "up_proj.weight": (spec.moe_ffn_hidden_size, hidden),
                           he + "down_proj.weight": (hidden, spec.moe_ffn_hidden_size)})
    return shapes


def check_shapes(hf_state: Mapping[str, torch.Tensor], spec: ModelSpec, names: Iterable[str] | None = None) -> None:
    """Raise CheckpointError naming every tensor whose shape differs from ``spec``'s layout."""
    expected = hf_shapes(spec)
    wrong = [f"{n}: {tuple(hf_state[n].shape)} != {expected.get(n)}" for n in (names or hf_state)
             if n in hf_state and tuple(hf_state[n].shape) != expected.get(n)]
    if wrong:
        raise CheckpointError(f"{len(wrong)} tensor(s) have the wrong shape for this ModelSpec (first: {wrong[:3]})",
                              mismatched=wrong[:10])
