"""The model's shape (:class:`ModelSpec`) and the megatron-core ``TransformerConfig`` it maps to.

Two architectures, both mapped exactly onto ``transformers`` (:mod:`rl.hf`):

- ``qwen3_moe`` (``Qwen3MoeForCausalLM``): every layer grouped-query attention with q/k RMSNorm
  and full RoPE, every MLP a top-k MoE without a shared expert;
- ``qwen3_5_moe`` (``Qwen3_5MoeForCausalLM``, the documents' model): a hybrid of GatedDeltaNet
  (linear attention) and gated full-attention layers in the pattern of ``layer_types``,
  partial RoPE, zero-centred RMSNorms (weight stored as ``w``, applied as ``1 + w``), every MLP a
  top-k MoE plus a sigmoid-gated shared expert (docs/model.md).

A spec comes from a checkpoint's ``config.json`` (:func:`rl.hf.spec_from_config`) or, for a random
init, from the hand-typed ``[model]`` fields.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch

from rl.errors import InputError
from rl.model_parallel import parallel_sizes

#: Qwen3-MoE constants the tiny model shares with the HF layout (rl.hf.qwen3_moe writes them to config.json).
RMS_NORM_EPS = 1e-6
ROPE_THETA = 1_000_000.0
ARCHITECTURES = ("qwen3_moe", "qwen3_5_moe")
LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class ModelSpec:
    """Model shape; the shape field names match ``t1ops.config.ModelConfig``.

    The Qwen3.5 fields (``layer_types`` .. ``linear_conv_kernel_dim``) only matter for
    ``arch = "qwen3_5_moe"``; ``head_dim`` 0 means ``hidden_size / num_attention_heads``.
    """

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: int = 128
    num_experts: int = 8
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int = 64
    max_seq_len: int = 2048
    vocab_size: int = 248_320
    num_query_groups: int = 2
    arch: str = "qwen3_moe"
    head_dim: int = 0
    rope_theta: float = ROPE_THETA
    partial_rotary_factor: float = 1.0
    layer_types: tuple[str, ...] = ()
    shared_expert_intermediate_size: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_types", tuple(self.layer_types))  # a list after a JSON round trip
        if self.num_attention_heads and self.head_dim == self.hidden_size // self.num_attention_heads:
            object.__setattr__(self, "head_dim", 0)  # one spelling of the default: equal specs compare equal
        if self.arch not in ARCHITECTURES:
            raise InputError(f"model arch {self.arch!r} is not supported; t1ops builds {list(ARCHITECTURES)}",
                             arch=self.arch)
        if self.arch == "qwen3_5_moe":
            if len(self.layer_types) != self.num_layers or set(self.layer_types) - {LINEAR, FULL}:
                raise InputError(f"qwen3_5_moe needs layer_types: one of {LINEAR!r}/{FULL!r} per layer "
                                 f"({self.num_layers}), got {list(self.layer_types)}", layer_types=list(self.layer_types))
            if self.linear_num_value_heads % max(1, self.linear_num_key_heads) or not self.linear_num_key_heads:
                raise InputError(f"linear_num_value_heads ({self.linear_num_value_heads}) must be a positive multiple "
                                 f"of linear_num_key_heads ({self.linear_num_key_heads})")
        elif self.layer_types and set(self.layer_types) != {FULL}:
            raise InputError("qwen3_moe has full-attention layers only; layer_types names linear layers")

    @property
    def kv_channels(self) -> int:
        """Attention head dimension."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def hybrid(self) -> bool:
        return self.arch == "qwen3_5_moe"

    def is_linear(self, layer: int) -> bool:
        """True when layer ``layer`` (0-based) is a GatedDeltaNet layer."""
        return self.hybrid and self.layer_types[layer] == LINEAR

    @property
    def num_moe_layers(self) -> int:
        """Layers with a router (every layer of both architectures): the L of R3's rows [T, L, K]."""
        return self.num_layers

    @classmethod
    def from_config(cls, config) -> "ModelSpec":
        """From any object with the same attribute names (e.g. ModelConfig); absent fields keep defaults."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)})

    def to_dict(self) -> dict:
        out = asdict(self)
        out["layer_types"] = list(self.layer_types)
        return out


def _check(spec: ModelSpec, dtype: torch.dtype, tp: int) -> None:
    if spec.vocab_size % tp:
        raise InputError(f"vocab_size {spec.vocab_size} is not divisible by tp = {tp}: the LM head and embedding "
                         "are split by vocabulary rows; pad the vocabulary to a multiple of tp",
                         vocab_size=spec.vocab_size, tp=tp)
    if dtype not in (torch.float32, torch.bfloat16):
        raise InputError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}", dtype=str(dtype))
    if spec.num_attention_heads % spec.num_query_groups:
        raise InputError(
            f"num_attention_heads ({spec.num_attention_heads}) must be a multiple of num_query_groups "
            f"({spec.num_query_groups}) for grouped-query attention",
            num_attention_heads=spec.num_attention_heads, num_query_groups=spec.num_query_groups,
        )
    if spec.moe_router_topk > spec.num_experts:
        raise InputError(
            f"moe_router_topk ({spec.moe_router_topk}) exceeds num_experts ({spec.num_experts})",
            moe_router_topk=spec.moe_router_topk, num_experts=spec.num_experts,
        )
    if spec.hybrid and (spec.linear_num_key_heads % tp or spec.linear_num_value_heads % tp):
        raise InputError(f"tp = {tp} must divide the GatedDeltaNet heads (key {spec.linear_num_key_heads}, value "
                         f"{spec.linear_num_value_heads}): each TP rank holds whole heads")


def _hybrid_fields(spec: ModelSpec) -> dict:
    """TransformerConfig fields of the Qwen3.5 hybrid (empty for qwen3_moe)."""
    if not spec.hybrid:
        return {}
    return dict(
        attention_output_gate=True,            # gated full attention: out * sigmoid(gate), gate from linear_qkv
        moe_shared_expert_intermediate_size=spec.shared_expert_intermediate_size or None,
        moe_shared_expert_gate=bool(spec.shared_expert_intermediate_size),
        linear_conv_kernel_dim=spec.linear_conv_kernel_dim,
        linear_key_head_dim=spec.linear_key_head_dim,
        linear_value_head_dim=spec.linear_value_head_dim,
        linear_num_key_heads=spec.linear_num_key_heads,
        linear_num_value_heads=spec.linear_num_value_heads,
        # FLA's Triton kernels need a GPU; megatron's deterministic mode runs its pure-torch chunked
        # gated delta rule and conv1d instead (the same arithmetic as transformers' reference path)
        deterministic_mode=not torch.cuda.is_available(),
    )


def _pipeline_fields(dtype: torch.dtype) -> dict:
    """The pipeline size of megatron's parallel state (rl.trainer.pipeline); empty without pipelining."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return {}
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    return dict(pipeline_model_parallel_size=pp, pipeline_dtype=dtype) if pp > 1 else {}


def transformer_config(spec: ModelSpec, dtype: torch.dtype, routing_replay: bool, sequence_parallel: bool = False):
    from megatron.core.transformer.transformer_config import TransformerConfig

    tp, ep = parallel_sizes()
    _check(spec, dtype, tp)
    return TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups,
        kv_channels=spec.kv_channels,
        ffn_hidden_size=spec.ffn_hidden_size,
        num_moe_experts=spec.num_experts,
        moe_router_topk=spec.moe_router_topk,
        moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
        moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="none",
        moe_enable_routing_replay=routing_replay,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # Expert MLP biases hit an in-place-on-view autograd error in mcore 0.16's
        # SequentialMLP; MoE models of this family carry no linear biases anyway.
        add_bias_linear=False,
        normalization="RMSNorm",
        layernorm_epsilon=RMS_NORM_EPS,
        qk_layernorm=True,
        gated_linear_unit=True,  # SwiGLU: fc1 = [gate; up], act(gate) * up
        activation_func=torch.nn.functional.silu,
        use_cpu_initialization=not torch.cuda.is_available(),
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        # the trainer's layout (rl.trainer.ranks); all 1 / False in a world of 1
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1,
        **_pipeline_fields(dtype),
        **_hybrid_fields(spec),
    )
