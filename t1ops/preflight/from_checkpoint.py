"""A plan's ``[model]`` from a Hugging Face checkpoint's ``config.json`` (``t1ops preflight PLAN --model DIR``).

The memory model describes the hybrid by ``full_attention_interval`` (every Nth layer full attention);
a checkpoint's ``layer_types`` must follow such a pattern (Qwen3.5's does: 3 GatedDeltaNet layers, then
one gated attention layer), otherwise it is refused by name rather than approximated.
"""
from __future__ import annotations

from pathlib import Path

from t1ops.errors import ConfigError
from t1ops.preflight.plan import ModelShape


def _interval(layer_types: tuple[str, ...]) -> int:
    if not layer_types or "linear_attention" not in layer_types:
        return 1
    first = layer_types.index("full_attention") + 1 if "full_attention" in layer_types else 0
    pattern = tuple("full_attention" if (i + 1) % first == 0 else "linear_attention"
                    for i in range(len(layer_types))) if first else ()
    if pattern != layer_types:
        raise ConfigError(f"layer_types {list(layer_types)} is not 'every Nth layer full attention': the memory "
                          "model cannot describe it", key="model.layer_types")
    return first


def model_shape(path: str | Path) -> ModelShape:
    """The plan's model of the checkpoint at ``path`` (its config.json only; no weights are read)."""
    from rl.errors import CheckpointError
    from rl.hf.layout import spec_from_config
    from rl.hf.reader import read_config

    try:
        spec = spec_from_config(read_config(path), where=str(Path(path) / "config.json"))
    except CheckpointError as exc:
        raise ConfigError(f"--model: {exc}", key="--model") from None
    return ModelShape(
        name=Path(path).name, num_layers=spec.num_layers, full_attention_interval=_interval(spec.layer_types),
        hidden_size=spec.hidden_size, num_attention_heads=spec.num_attention_heads,
        num_kv_groups=spec.num_query_groups, head_dim=spec.kv_channels, attention_output_gate=spec.hybrid,
        gdn_num_key_heads=spec.linear_num_key_heads or 1, gdn_num_value_heads=spec.linear_num_value_heads or 1,
        gdn_head_dim=max(spec.linear_key_head_dim, spec.linear_value_head_dim, 8), gdn_conv_kernel=spec.linear_conv_kernel_dim,
        num_experts=spec.num_experts, moe_router_topk=spec.moe_router_topk,
        num_shared_experts=1 if spec.shared_expert_intermediate_size else 0, moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
        shared_expert_ffn_hidden_size=spec.shared_expert_intermediate_size, vocab_size=spec.vocab_size,
        tie_embeddings=False)
