"""The exact map between the megatron-core Qwen3.5-MoE policy (:mod:`rl.model.qwen35`) and
``transformers``' ``Qwen3_5MoeForCausalLM``.

Names (L = layer, E = expert; megatron left, Hugging Face checkpoint right). Every layer::

    decoder.layers.L.input_layernorm.weight          model.layers.L.input_layernorm.weight   (stored w, applied 1 + w)
    decoder.layers.L.pre_mlp_layernorm.weight        model.layers.L.post_attention_layernorm.weight
    decoder.layers.L.mlp.router.weight               model.layers.L.mlp.gate.weight
    decoder.layers.L.mlp.experts.local_experts.E.*   model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
    decoder.layers.L.mlp.shared_experts.linear_fc1   model.layers.L.mlp.shared_expert.{gate,up}_proj.weight
    decoder.layers.L.mlp.shared_experts.linear_fc2   model.layers.L.mlp.shared_expert.down_proj.weight
    decoder.layers.L.mlp.shared_experts.gate_weight  model.layers.L.mlp.shared_expert_gate.weight

A GatedDeltaNet layer (``layer_types[L] == "linear_attention"``)::

    self_attention.in_proj.weight    linear_attn.in_proj_{qkv,z,b,a}.weight   (stacked in that order)
    self_attention.conv1d.weight     linear_attn.conv1d.weight
    self_attention.A_log / dt_bias   linear_attn.A_log / dt_bias
    self_attention.out_norm.weight   linear_attn.norm.weight
    self_attention.out_proj.weight   linear_attn.out_proj.weight

A gated full-attention layer: ``self_attention.linear_qkv`` <-> ``self_attn.{q,k,v}_proj`` (``q_proj``
holds each head's query then its output gate, :func:`rl.hf.units.grouped_qkv`), the q/k norms and
``o_proj`` as in Qwen3-MoE. Then ``model.norm`` and ``lm_head``.

Checkpoints of ``Qwen3_5MoeForConditionalGeneration`` (the released models: ``model_type``
``qwen3_5_moe`` with a ``text_config``) name the same tensors ``model.language_model.*``; their
vision tower (``model.visual.*``) and multi-token-prediction layers (``mtp.*``) are not part of the
policy and are set aside on load (:mod:`rl.hf.checkpoint` says so once).
"""
from __future__ import annotations

from typing import Mapping

from rl.errors import CheckpointError, InputError
from rl.hf.qwen3_moe import check_common, field, moe_shapes, moe_units, num_experts, rope_theta
from rl.hf.units import Unit, concat, grouped_qkv, plain, swiglu
from rl.model import RMS_NORM_EPS, ModelSpec

ARCHITECTURE = "Qwen3_5MoeForCausalLM"
MODEL_TYPES = ("qwen3_5_moe_text", "qwen3_5_moe")  # the text model's own, and the multimodal wrapper's
TEXT_MODEL_TYPE = "qwen3_5_moe_text"


def text_config(config: Mapping) -> Mapping:
    """The text model's settings: the file itself, or its ``text_config`` in the multimodal wrapper."""
    return config.get("text_config") or config if config.get("model_type") == "qwen3_5_moe" else config


def config_dict(spec: ModelSpec, torch_dtype: str = "float32", bos_token_id: int | None = None,
                eos_token_id: int | None = None) -> dict:
    """``config.json`` of the ``Qwen3_5MoeForCausalLM`` equal to ``spec``."""
    if not spec.hybrid:
        raise InputError(f"a {spec.arch} spec has no Qwen3.5-MoE config.json", arch=spec.arch)
    return {
        "architectures": [ARCHITECTURE], "model_type": TEXT_MODEL_TYPE,
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers, "layer_types": list(spec.layer_types),
        "num_attention_heads": spec.num_attention_heads, "num_key_value_heads": spec.num_query_groups,
        "head_dim": spec.kv_channels, "moe_intermediate_size": spec.moe_ffn_hidden_size,
        "shared_expert_intermediate_size": spec.shared_expert_intermediate_size,
        "num_experts": spec.num_experts, "num_experts_per_tok": spec.moe_router_topk,
        "linear_conv_kernel_dim": spec.linear_conv_kernel_dim, "linear_key_head_dim": spec.linear_key_head_dim,
        "linear_value_head_dim": spec.linear_value_head_dim, "linear_num_key_heads": spec.linear_num_key_heads,
        "linear_num_value_heads": spec.linear_num_value_heads,
        "hidden_act": "silu", "rms_norm_eps": RMS_NORM_EPS,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta,
                            "partial_rotary_factor": spec.partial_rotary_factor},
        "max_position_embeddings": spec.max_seq_len, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "use_cache": True, "output_router_logits": False,
        "router_aux_loss_coef": 0.0, "initializer_range": 0.02, "dtype": torch_dtype,
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id,
    }


def spec_from_config(config: Mapping, where: str = "config.json") -> ModelSpec:
    """The :class:`ModelSpec` of a Qwen3.5-MoE ``config.json`` (text model or the multimodal wrapper)."""
    if config.get("model_type") not in MODEL_TYPES:
        raise CheckpointError(f"{where}: model_type {config.get('model_type')!r} is not one of {list(MODEL_TYPES)}")
    text = text_config(config)
    wrong = check_common(text, where)
    if wrong:
        raise CheckpointError(f"{where}: {wrong} differ from the layout rl.model builds (silu, no attention bias, "
                              "untied embeddings, rms_norm_eps 1e-6, default RoPE)", fields=sorted(wrong))
    heads, hidden = int(field(text, "num_attention_heads", where)), int(field(text, "hidden_size", where))
    rope = text.get("rope_parameters") or {}
    return ModelSpec(
        arch="qwen3_5_moe", num_layers=int(field(text, "num_hidden_layers", where)), hidden_size=hidden,
        num_attention_heads=heads, num_query_groups=int(text.get("num_key_value_heads", heads)),
        head_dim=int(text.get("head_dim") or hidden // heads),
        ffn_hidden_size=int(text.get("intermediate_size") or 4 * hidden),
        num_experts=num_experts(text, where),
        moe_router_topk=int(field(text, "num_experts_per_tok", where)),
        moe_ffn_hidden_size=int(field(text, "moe_intermediate_size", where)),
        shared_expert_intermediate_size=int(text.get("shared_expert_intermediate_size") or 0),
        max_seq_len=int(field(text, "max_position_embeddings", where)),
        vocab_size=int(field(text, "vocab_size", where)),
        rope_theta=rope_theta(text),
        partial_rotary_factor=float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))),
        layer_types=tuple(field(text, "layer_types", where)),
        linear_conv_kernel_dim=int(field(text, "linear_conv_kernel_dim", where)),
        linear_key_head_dim=int(field(text, "linear_key_head_dim", where)),
        linear_value_head_dim=int(field(text, "linear_value_head_dim", where)),
        linear_num_key_heads=int(field(text, "linear_num_key_heads", where)),
        linear_num_value_heads=int(field(text, "linear_num_value_heads", where)),
    )


def _gdn_sizes(spec: ModelSpec) -> tuple[int, int, int]:
    return (spec.linear_key_head_dim * spec.linear_num_key_heads,
            spec.linear_value_head_dim * spec.linear_num_value_heads, spec.linear_num_value_heads)


def units(spec: ModelSpec) -> list[Unit]:
    """Every conversion unit of ``spec``'s policy, in checkpoint order."""
    qk, v, heads = _gdn_sizes(spec)
    groups = spec.num_query_groups
    out = [plain("embedding.word_embeddings.weight", "model.embed_tokens.weight")]
    for layer in range(spec.num_layers):
        m, h = f"decoder.layers.{layer}.", f"model.layers.{layer}."
        out.append(plain(m + "input_layernorm.weight", h + "input_layernorm.weight"))
        if spec.is_linear(layer):
            a, la = m + "self_attention.", h + "linear_attn."
            out += [concat(a + "in_proj.weight", tuple(la + f"in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")),
                           (2 * qk + v, v, heads, heads)),
                    plain(a + "conv1d.weight", la + "conv1d.weight"),
                    plain(a + "A_log", la + "A_log"), plain(a + "dt_bias", la + "dt_bias"),
                    plain(a + "out_norm.weight", la + "norm.weight"),
                    plain(a + "out_proj.weight", la + "out_proj.weight")]
        else:
            a, sa = m + "self_attention.", h + "self_attn."
            out += [grouped_qkv(a + "linear_qkv.weight", tuple(sa + f"{p}_proj.weight" for p in "qkv"), groups,
                                spec.num_attention_heads // groups, spec.kv_channels, gated=True),
                    plain(a + "q_layernorm.weight", sa + "q_norm.weight"),
                    plain(a + "k_layernorm.weight", sa + "k_norm.weight"),
                    plain(a + "linear_proj.weight", sa + "o_proj.weight")]
        out.append(plain(m + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight"))
        out += moe_units(spec, m, h)
        if spec.shared_expert_intermediate_size:
            ms, hs = m + "mlp.shared_experts.", h + "mlp.shared_expert."
            out += [swiglu(ms + "linear_fc1.weight", hs, spec.shared_expert_intermediate_size),
                    plain(ms + "linear_fc2.weight", hs + "down_proj.weight"),
                    plain(ms + "gate_weight", h + "mlp.shared_expert_gate.weight")]
    out += [plain("decoder.final_layernorm.weight", "model.norm.weight"), plain("output_layer.weight", "lm_head.weight")]
    return out


def hf_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Expected shape of every Hugging Face tensor (for checking an import before converting)."""
    qk, v, heads = _gdn_sizes(spec)
    hidden, dim, shared = spec.hidden_size, spec.kv_channels, spec.shared_expert_intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, hidden),
                                          "model.norm.weight": (hidden,), "lm_head.weight": (spec.vocab_size, hidden)}
    for layer in range(spec.num_layers):
        h = f"model.layers.{layer}."
        shapes.update({h + "input_layernorm.weight": (hidden,), h + "post_attention_layernorm.weight": (hidden,)})
        if spec.is_linear(layer):
            la = h + "linear_attn."
            shapes.update({la + "in_proj_qkv.weight": (2 * qk + v, hidden), la + "in_proj_z.weight": (v, hidden),
                           la + "in_proj_b.weight": (heads, hidden), la + "in_proj_a.weight": (heads, hidden),
                           la + "conv1d.weight": (2 * qk + v, 1, spec.linear_conv_kernel_dim),
                           la + "A_log": (heads,), la + "dt_bias": (heads,),
                           la + "norm.weight": (spec.linear_value_head_dim,), la + "out_proj.weight": (hidden, v)})
        else:
            sa = h + "self_attn."
            shapes.update({sa + "q_proj.weight": (2 * spec.num_attention_heads * dim, hidden),
                           sa + "k_proj.weight": (spec.num_query_groups * dim, hidden),
                           sa + "v_proj.weight": (spec.num_query_groups * dim, hidden),
                           sa + "o_proj.weight": (hidden, spec.num_attention_heads * dim),
                           sa + "q_norm.weight": (dim,), sa + "k_norm.weight": (dim,)})
        shapes.update(moe_shapes(spec, h))
        if shared:
            hs = h + "mlp.shared_expert."
            shapes.update({hs + "gate_proj.weight": (shared, hidden), hs + "up_proj.weight": (shared, hidden),
                           hs + "down_proj.weight": (hidden, shared), h + "mlp.shared_expert_gate.weight": (1, hidden)})
    return shapes
