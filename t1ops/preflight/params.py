"""Parameter counts of a hybrid GatedDeltaNet / full-attention MoE model, per GPU.

Pure arithmetic on a :class:`~t1ops.preflight.plan.Plan`; no torch. Counts are
parameters (not bytes). Layout rules (report section 08):

- routed experts are split by EP (and ETP) within a pipeline stage;
- full attention and the shared expert are split by TP;
- GatedDeltaNet blocks are plain linear layers, *replicated* across TP;
- the router and norms are replicated;
- the embedding and the LM head are vocab-parallel (split by TP) on the first
  and last stage; the critic's LM head is a scalar value head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from t1ops.preflight.plan import ModelShape, Plan

Role = Literal["actor", "critic"]


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one layer, by how they are split across GPUs."""

    routed_expert: int      # one routed expert (gate, up, down)
    shared_experts: int     # all shared experts of a layer
    router: int
    gdn: int                # one GatedDeltaNet block
    full_attention: int     # one full-attention block
    embedding: int          # vocab x hidden


def layer_params(m: ModelShape) -> LayerParams:
    """Per-layer parameter counts from the model shape (norms are negligible and omitted)."""
    h = m.hidden_size
    q_out = m.num_attention_heads * m.head_dim * (2 if m.attention_output_gate else 1)
    kv_out = 2 * m.num_kv_groups * m.head_dim
    attn = h * (q_out + kv_out) + m.num_attention_heads * m.head_dim * h
    key_dim = m.gdn_num_key_heads * m.gdn_head_dim
    value_dim = m.gdn_num_value_heads * m.gdn_head_dim
    # in_proj: q, k, v and the output gate z; in_proj_ba: one beta and one alpha per value head.
    gdn = (h * (2 * key_dim + 2 * value_dim) + h * 2 * m.gdn_num_value_heads
           + (2 * key_dim + value_dim) * m.gdn_conv_kernel + value_dim * h)
    shared = m.num_shared_experts * (3 * h * m.shared_expert_ffn_hidden_size + h)
    return LayerParams(routed_expert=3 * h * m.moe_ffn_hidden_size, shared_experts=shared,
                       router=h * m.num_experts, gdn=gdn, full_attention=attn,
                       embedding=m.vocab_size * h)


def total_params(m: ModelShape) -> int:
    """Whole-model parameter count (one role)."""
    p = layer_params(m)
    per_layer_moe = m.num_experts * p.routed_expert + p.shared_experts + p.router
    heads = p.embedding * (1 if m.tie_embeddings else 2)
    return (m.num_layers * per_layer_moe + m.num_gdn_layers * p.gdn
            + m.num_full_attention_layers * p.full_attention + heads)


def total_expert_params(m: ModelShape) -> int:
    """Routed-expert parameters of the whole model."""
    return m.num_layers * m.num_experts * layer_params(m).routed_expert


@dataclass(frozen=True)
class GpuParams:
    """Parameters held by one GPU of one pipeline stage, split by optimizer sharding group."""

    expert: int   # routed experts: optimizer sharded over expert-DP
    dense: int    # everything else: optimizer sharded over DP x CP


def stage_layer_kinds(plan: Plan, stage: int) -> tuple[int, int]:
    """(GatedDeltaNet layers, full-attention layers) on pipeline stage ``stage``."""
    m, n = plan.model, plan.layers_per_stage
    first = stage * n
    full = sum(1 for i in range(first, first + n) if (i + 1) % m.full_attention_interval == 0)
    return n - full, full


def gpu_params(plan: Plan, stage: int, role: Role, ep: int | None = None) -> GpuParams:
    """Parameters one GPU of ``stage`` holds for ``role``; ``ep`` overrides the plan's EP."""
    m, par = plan.model, plan.parallelism
    p = layer_params(m)
    ep = ep or par.ep
    n_gdn, n_full = stage_layer_kinds(plan, stage)
    n = n_gdn + n_full
    expert = n * (m.num_experts // ep) * p.routed_expert // par.etp
    dense = (n_gdn * p.gdn + n * p.router
             + (n_full * p.full_attention + n * p.shared_experts) // par.tp)
    if stage == 0:
        dense += p.embedding // par.tp
    if stage == par.pp - 1:
        dense += (p.embedding // par.tp) if role == "actor" and not m.tie_embeddings else m.hidden_size
    return GpuParams(expert=expert, dense=dense)
