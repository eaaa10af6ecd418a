"""The memory model's per-token activation term against CPU ranks, layout by layout.

:func:`t1ops.campaign.trainer_rank.measure_layouts` trains one PPO step of the tiny Qwen3.5-MoE hybrid (:data:`TINY_HYBRID`: GatedDeltaNet,
gated attention, MoE with a shared expert, 4 layers) on real gloo ranks
(:func:`t1ops.campaign.trainer_rank.run_local_ranks`) at each layout of :data:`LAYOUTS`, on the same batch:
one long sample (``long_tokens``) that is its own micro-batch, as the report's 84k sample is, beside short
samples that fill packed bins at the cap. Each rank's peak of the bytes autograd holds for backward
(:class:`rl.trainer.activations.SavedActivations`) divided by the long sample's tokens is its bytes per
token; a layout's figure is its worst rank. :func:`model_bytes_per_token` is the memory model's
prediction for the same shape and layout, from the same term preflight uses
(:func:`t1ops.preflight.memory.activation_bytes`, worst pipeline stage). The measured points are recorded
in :data:`t1ops.preflight.calibration.ACTIVATION_LAYOUT_POINTS`; ``bench/bench_activations.py`` prints
the table (docs/preflight.md, "Calibration on CPU ranks").
"""
from __future__ import annotations

from dataclasses import dataclass

from t1ops.preflight import calibration as cal
from t1ops.preflight.memory import activation_bytes
from t1ops.preflight.plan import (
    BatchPlan,
    ModelShape,
    Parallelism,
    Plan,
    PrecisionPlan,
    RolesPlan,
)

#: The tiny hybrid's shape (tests/rl/hf_models.hybrid_spec builds the layout tests' model from it).
TINY_HYBRID = dict(arch="qwen3_5_moe", num_layers=4, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                   head_dim=16, ffn_hidden_size=64, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16,
                   shared_expert_intermediate_size=24, max_seq_len=64, vocab_size=64, rope_theta=1e4,
                   partial_rotary_factor=0.25, layer_types=("linear_attention", "full_attention") * 2,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)

#: Layout name -> (tp, pp, cp); tp > 1 runs with sequence parallelism, as the trainer requires.
LAYOUTS = cal.ACTIVATION_LAYOUTS


@dataclass(frozen=True)
class LayoutPoint:
    """One layout's activation bytes per token of the long sample, per rank (worst rank / worst stage)."""

    name: str
    measured: float
    model: float


def tiny_plan(tp: int, pp: int, cp: int, *, long_tokens: int, cap: int, samples: int) -> Plan:
    """A plan of the tiny hybrid at ``(tp, pp, cp)`` with the measured run's batch and precision (fp32 weights,
    no recompute). The vocabulary and the expert count do not enter the activation term; the plan keeps
    their defaults (a plan's vocabulary is at least 256)."""
    s = TINY_HYBRID
    model = ModelShape(name="tiny Qwen3.5-MoE hybrid", num_layers=s["num_layers"], full_attention_interval=2,
                       hidden_size=s["hidden_size"], num_attention_heads=s["num_attention_heads"],
                       num_kv_groups=s["num_query_groups"], head_dim=s["head_dim"])
    return Plan(model=model,
                parallelism=Parallelism(train_gpus=tp * pp * cp, tp=tp, pp=pp, cp=cp, ep=1),
                batch=BatchPlan(context_wall_tokens=long_tokens, max_tokens_per_gpu=cap, samples_per_step=samples,
                                mean_sample_tokens=long_tokens),
                precision=PrecisionPlan(param_bytes=4, full_recompute=False, r3=True),
                roles=RolesPlan(critic=True, critic_only_steps=0))


def model_bytes_per_token(tp: int, pp: int, cp: int, *, long_tokens: int = cal.ACTIVATION_LONG_TOKENS,
                          cap: int = cal.ACTIVATION_CAP_TOKENS, samples: int = cal.ACTIVATION_SAMPLES) -> float:
    """The memory model's activation bytes on its worst stage, per token of the long sample."""
    plan = tiny_plan(tp, pp, cp, long_tokens=long_tokens, cap=cap, samples=samples)
    return max(activation_bytes(plan, s) for s in range(pp)) / long_tokens


def recorded_points() -> list[LayoutPoint]:
    """The recorded CPU measurements beside the model's predictions, in :data:`LAYOUTS` order."""
    return [LayoutPoint(name, cal.ACTIVATION_LAYOUT_POINTS[name], model_bytes_per_token(*layout))
            for name, layout in LAYOUTS.items()]
