"""Tiny checkpoints written by ``transformers`` itself (its classes, its ``save_pretrained``), for the
equality tests of both architectures: every tensor perturbed, so a swapped or mis-split map cannot pass
(zero-centred norms start at 0, GatedDeltaNet's A_log and dt_bias at fixed values)."""
from __future__ import annotations

from pathlib import Path

import torch

QWEN35 = dict(vocab_size=320, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
              num_experts_per_tok=2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=256,
              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
# head_dim 24 != hidden / heads (as in the released Qwen3-MoE models: 128 vs 2048 / 32)
QWEN3 = dict(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=24, intermediate_size=128, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
             norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=False)


def hf_model(arch: str, seed: int = 0, **overrides):
    """A perturbed fp32 ``transformers`` model of ``arch`` (``qwen3_5_moe`` or ``qwen3_moe``), in eval mode."""
    import transformers

    if arch == "qwen3_5_moe":
        config = transformers.Qwen3_5MoeTextConfig(**{**QWEN35, **overrides})
        cls = transformers.Qwen3_5MoeForCausalLM
    else:
        config = transformers.Qwen3MoeConfig(**{**QWEN3, **overrides})
        cls = transformers.Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    model = cls(config).float()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


def write_checkpoint(arch: str, out: Path, seed: int = 0, **overrides) -> Path:
    hf_model(arch, seed, **overrides).save_pretrained(out)
    return out


def hf_logits(model, ids_BT: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids_BT).logits.float()


def hybrid_spec(**overrides):
    """A 4-layer Qwen3.5-MoE ``ModelSpec`` (GatedDeltaNet, gated attention, twice; shared expert) for the
    layout tests (context and pipeline parallelism): small enough for gloo ranks on a CPU."""
    from rl.model import ModelSpec
    from t1ops.preflight.cpu_activations import TINY_HYBRID

    return ModelSpec(**{**TINY_HYBRID, **overrides})
