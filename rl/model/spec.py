"""The model's shape (:class:`ModelSpec`) and the megatron-core ``TransformerConfig`` it maps to.

Configured as Qwen3-MoE so that :mod:`rl.hf` maps the model exactly onto ``transformers``'
``Qwen3MoeForCausalLM`` (the settings are listed in :mod:`rl.model`'s docstring).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from rl.errors import InputError
from rl.model_parallel import parallel_sizes

#: Qwen3-MoE constants the tiny model shares with the HF layout (rl.hf.qwen3_moe writes them to config.json).
RMS_NORM_EPS = 1e-6
ROPE_THETA = 1_000_000.0


@dataclass(frozen=True)
class ModelSpec:
    """Model shape; field names match ``t1ops.config.ModelConfig``."""

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

    @classmethod
    def from_config(cls, config) -> "ModelSpec":
        """From any object with the same attribute names (e.g. ModelConfig)."""
        return cls(**{name: getattr(config, name) for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict:
        return asdict(self)


def transformer_config(spec: ModelSpec, dtype: torch.dtype, routing_replay: bool, sequence_parallel: bool = False):
    from megatron.core.transformer.transformer_config import TransformerConfig

    tp, ep = parallel_sizes()
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
    return TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups,
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
    )

