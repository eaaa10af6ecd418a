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
``experts.gate_up_proj`` on load and writes them back per expert). Every conversion is a
reshape/split/concat (:mod:`rl.hf.units`): bit-exact both ways. The architecture-independent
functions (``to_hf``, ``from_hf``, ``check_shapes``) are :mod:`rl.hf.layout`.
"""
from __future__ import annotations

from typing import Mapping

from rl.errors import CheckpointError, InputError
from rl.hf.units import Unit, grouped_qkv, plain, swiglu
from rl.model import RMS_NORM_EPS, ROPE_THETA, ModelSpec

ARCHITECTURE = "Qwen3MoeForCausalLM"
MODEL_TYPE = "qwen3_moe"


def head_dim(spec: ModelSpec) -> int:
    return spec.kv_channels


def rope_theta(config: Mapping) -> float:
    """``rope_parameters.rope_theta`` (transformers 5) or the older top-level ``rope_theta``."""
    rope = config.get("rope_parameters") or {}
    return float(rope.get("rope_theta", config.get("rope_theta", ROPE_THETA)))


def field(config: Mapping, key: str, where: str = "config.json"):
    """``config[key]``, or a CheckpointError naming the missing key."""
    if key not in config:
        raise CheckpointError(f"{where} has no {key!r}: not a checkpoint of this architecture, or truncated",
                              missing=key)
    return config[key]


def num_experts(config: Mapping, where: str) -> int:
    """``num_experts`` (the checkpoints' key), or ``num_local_experts`` (transformers 5's name for Qwen3-MoE)."""
    return int(config["num_experts"] if "num_experts" in config else field(config, "num_local_experts", where))


def check_common(config: Mapping, where: str) -> dict:
    """The settings rl.model builds for both architectures; anything else is refused by name."""
    wrong = {}
    if config.get("hidden_act", "silu") != "silu":
        wrong["hidden_act"] = config["hidden_act"]
    if config.get("attention_bias", False):
        wrong["attention_bias"] = config["attention_bias"]
    if config.get("tie_word_embeddings", False):
        wrong["tie_word_embeddings"] = config["tie_word_embeddings"]
    if float(config.get("rms_norm_eps", RMS_NORM_EPS)) != RMS_NORM_EPS:
        wrong["rms_norm_eps"] = config["rms_norm_eps"]
    rope_type = (config.get("rope_parameters") or {}).get("rope_type", "default")
    if rope_type != "default" or config.get("rope_scaling"):
        wrong["rope_type"] = rope_type
    return wrong


def config_dict(spec: ModelSpec, torch_dtype: str = "float32", bos_token_id: int | None = None,
                eos_token_id: int | None = None) -> dict:
    """``config.json`` of the Qwen3-MoE model equal to ``spec`` (every layer sparse, no shared expert)."""
    if spec.arch != MODEL_TYPE:
        raise InputError(f"a {spec.arch} spec has no Qwen3-MoE config.json", arch=spec.arch)
    theta = spec.rope_theta
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_hidden_size, "moe_intermediate_size": spec.moe_ffn_hidden_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_query_groups, "head_dim": head_dim(spec),
        "num_experts": spec.num_experts, "num_experts_per_tok": spec.moe_router_topk,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "hidden_act": "silu", "rms_norm_eps": RMS_NORM_EPS, "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "max_position_embeddings": spec.max_seq_len, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "use_cache": True, "output_router_logits": False,
        "router_aux_loss_coef": 0.0, "use_sliding_window": False, "sliding_window": None,
        "initializer_range": 0.02, "torch_dtype": torch_dtype, "dtype": torch_dtype,
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id,
    }


def spec_from_config(config: Mapping, where: str = "config.json") -> ModelSpec:
    """The :class:`ModelSpec` of a Qwen3-MoE ``config.json``; refuses what rl.model cannot express."""
    if config.get("model_type") != MODEL_TYPE:
        raise CheckpointError(f"{where}: model_type {config.get('model_type')!r} is not {MODEL_TYPE!r}")
    wrong = check_common(config, where)
    if not config.get("norm_topk_prob", False):
        wrong["norm_topk_prob"] = config.get("norm_topk_prob", False)
    if int(config.get("decoder_sparse_step", 1)) != 1 or config.get("mlp_only_layers"):
        wrong["mlp_only_layers"] = config.get("mlp_only_layers")
    if wrong:
        raise CheckpointError(f"{where}: {wrong} differ from the layout rl.model builds (silu, no attention bias, "
                              "untied embeddings, rms_norm_eps 1e-6, default RoPE, normalised top-k, no dense layers)",
                              fields=sorted(wrong))
    heads, hidden = int(field(config, "num_attention_heads", where)), int(field(config, "hidden_size", where))
    return ModelSpec(num_layers=int(field(config, "num_hidden_layers", where)), hidden_size=hidden,
                     num_attention_heads=heads, ffn_hidden_size=int(config.get("intermediate_size", 4 * hidden)),
                     num_experts=num_experts(config, where),
                     moe_router_topk=int(field(config, "num_experts_per_tok", where)),
                     moe_ffn_hidden_size=int(field(config, "moe_intermediate_size", where)),
                     max_seq_len=int(field(config, "max_position_embeddings", where)),
                     vocab_size=int(field(config, "vocab_size", where)),
                     num_query_groups=int(config.get("num_key_value_heads", heads)),
                     arch=MODEL_TYPE, head_dim=int(config.get("head_dim") or hidden // heads),
                     rope_theta=rope_theta(config))


def units(spec: ModelSpec) -> list[Unit]:
    """Every conversion unit of ``spec``'s policy, in checkpoint order."""
    groups, dim = spec.num_query_groups, head_dim(spec)
    out = [plain("embedding.word_embeddings.weight", "model.embed_tokens.weight")]
    for layer in range(spec.num_layers):
        m, h = f"decoder.layers.{layer}.", f"model.layers.{layer}."
        out += [
            plain(m + "input_layernorm.weight", h + "input_layernorm.weight"),
            grouped_qkv(m + "self_attention.linear_qkv.weight", tuple(h + f"self_attn.{p}_proj.weight" for p in "qkv"),
                        groups, spec.num_attention_heads // groups, dim, gated=False),
            plain(m + "self_attention.q_layernorm.weight", h + "self_attn.q_norm.weight"),
            plain(m + "self_attention.k_layernorm.weight", h + "self_attn.k_norm.weight"),
            plain(m + "self_attention.linear_proj.weight", h + "self_attn.o_proj.weight"),
            plain(m + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight"),
        ]
        out += moe_units(spec, m, h)
    out += [plain("decoder.final_layernorm.weight", "model.norm.weight"), plain("output_layer.weight", "lm_head.weight")]
    return out


def moe_units(spec: ModelSpec, m: str, h: str) -> list[Unit]:
    """The router and routed experts of one layer (Qwen3-MoE's names; Qwen3.5 adds its shared expert)."""
    out = [plain(m + "mlp.router.weight", h + "mlp.gate.weight")]
    for e in range(spec.num_experts):
        me, he = m + f"mlp.experts.local_experts.{e}.", h + f"mlp.experts.{e}."
        out += [swiglu(me + "linear_fc1.weight", he, spec.moe_ffn_hidden_size),
                plain(me + "linear_fc2.weight", he + "down_proj.weight")]
    return out


def moe_shapes(spec: ModelSpec, h: str) -> dict[str, tuple[int, ...]]:
    hidden = spec.hidden_size
    shapes = {h + "mlp.gate.weight": (spec.num_experts, hidden)}
    for e in range(spec.num_experts):
        he = h + f"mlp.experts.{e}."
        shapes.update({he + "gate_proj.weight": (spec.moe_ffn_hidden_size, hidden),
                       he + "up_proj.weight": (spec.moe_ffn_hidden_size, hidden),
                       he + "down_proj.weight": (hidden, spec.moe_ffn_hidden_size)})
    return shapes


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
                       h + "self_attn.q_norm.weight": (dim,), h + "self_attn.k_norm.weight": (dim,)})
        shapes.update(moe_shapes(spec, h))
    return shapes
