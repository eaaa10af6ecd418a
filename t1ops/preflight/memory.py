"""Per-GPU memory model: bytes by term, per role, pipeline stage and step phase.

A PPO step on one GPU set runs, in order (report sections 04-05, 08):

1. ``critic-only``: the critic re-calibration steps (the actor never loads);
2. ``joint:critic``: the critic trains in a joint step; the rollout's routing
   record is staged for the actor and the actor has been resident this step;
3. ``joint:actor``: the actor trains; the critic has been resident.

Each phase's peak is taken over pipeline stages and is::

    resident = weights + grads + optimizer + activations + routing_replay
               + offload_residue + allocator_reserve
    peak     = resident + max(logits_buffer, gdn_activation)

``logits_buffer`` and ``gdn_activation`` are transients that are never live
together: the LM-head loss frees its buffer before the layers' backward
recomputes them. Constants are in :mod:`t1ops.preflight.calibration`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from t1ops.preflight import calibration as cal
from t1ops.preflight.params import Role, gpu_params, stage_layer_kinds
from t1ops.preflight.plan import Plan

TERMS = ("weights", "grads", "optimizer", "activations", "routing_replay",
         "offload_residue", "allocator_reserve", "logits_buffer", "gdn_activation")
TRANSIENTS = ("logits_buffer", "gdn_activation")


def logits_buffer_bytes(tokens_per_gpu: int, vocab_size: int, tp: int) -> int:
    """fp32 logits [tokens/CP, vocab/TP] on the last stage (report 08: 29.8 GiB at 84k, CP 2, TP 2)."""
    return tokens_per_gpu * math.ceil(vocab_size / tp) * cal.LOGITS_BYTES_PER_ELEMENT


def gdn_activation_bytes(sample_tokens: int, cp: int, native_cp: bool) -> int:
    """GatedDeltaNet activation peak for one sample (report 08: 10.57 -> 2.70 GiB at CP 4).

    Without native CP the generic path is not CP-safe and runs the full sample
    on every rank; with it each rank holds tokens/CP plus the exchanged state.
    """
    if cp == 1 or not native_cp:
        return sample_tokens * cal.GDN_ACTIVATION_BYTES_PER_TOKEN
    return math.ceil(sample_tokens / cp) * cal.GDN_ACTIVATION_BYTES_PER_TOKEN + cal.GDN_CP_EXCHANGE_BYTES


def routing_record_bytes(num_tokens: int, num_moe_layers: int, topk: int) -> int:
    """R3 routing record: one int32 expert id per token, MoE layer and top-k slot (report 05)."""
    return num_tokens * num_moe_layers * topk * cal.ROUTING_ID_BYTES


def binding_tokens_per_gpu(plan: Plan) -> int:
    """Tokens per GPU of the largest micro-batch: an indivisible sample or a packed bin.

    The packer fills bins up to ``max_tokens_per_gpu``, but a sample longer than
    the cap lands alone in its own bin at full length (report 09).
    """
    sample = math.ceil(plan.batch.binding_sample_tokens / plan.parallelism.cp)
    return max(sample, plan.batch.max_tokens_per_gpu)


def _stored_bytes_per_token_layer(plan: Plan) -> int:
    """Activation bytes a layer keeps per token until its backward.

    Full recompute keeps each layer's input, [tokens/CP, hidden] bf16, not split by
    TP: the GatedDeltaNet wrapper all-gathers the sequence before its blocks (report
    08). Without recompute every layer keeps its intermediates, which we bound by
    the measured per-layer GatedDeltaNet peak (~330 KiB/token).
    """
    if plan.precision.full_recompute:
        return plan.model.hidden_size * plan.precision.param_bytes
    return cal.GDN_ACTIVATION_BYTES_PER_TOKEN


def in_flight_tokens(plan: Plan, stage: int) -> int:
    """Tokens whose activations ``stage`` holds at once: under 1F1B stage s holds pp - s micro-batches,
    the binding one and packed bins at the cap."""
    return binding_tokens_per_gpu(plan) + (plan.parallelism.pp - stage - 1) * plan.batch.max_tokens_per_gpu


def activation_bytes(plan: Plan, stage: int) -> int:
    """The per-token activation term on one GPU of ``stage``: tokens in flight x layers of the stage x
    bytes a layer keeps per token. Its layout scaling is checked against CPU ranks
    (calibration.ACTIVATION_LAYOUT_POINTS, docs/preflight.md)."""
    return in_flight_tokens(plan, stage) * plan.layers_per_stage * _stored_bytes_per_token_layer(plan)


@dataclass(frozen=True)
class Phase:
    name: str
    role: Role
    routing_staged: bool
    residue: bool


def phases(plan: Plan) -> list[Phase]:
    """The step phases in execution order."""
    if not plan.roles.critic:
        return [Phase("actor", "actor", plan.precision.r3, False)]
    out = [Phase("critic-only", "critic", False, False)] if plan.roles.critic_only_steps else []
    return out + [Phase("joint:critic", "critic", plan.precision.r3, True),
                  Phase("joint:actor", "actor", plan.precision.r3, True)]


@dataclass
class StageMemory:
    """Bytes per term on one GPU of one stage in one phase."""

    phase: str
    stage: int
    terms: dict[str, int] = field(default_factory=dict)

    @property
    def binding_transient(self) -> str:
        return max(TRANSIENTS, key=lambda t: self.terms[t])

    @property
    def peak_bytes(self) -> int:
        resident = sum(v for k, v in self.terms.items() if k not in TRANSIENTS)
        return resident + self.terms[self.binding_transient]


def stage_memory(plan: Plan, phase: Phase, stage: int, ep: int | None = None) -> StageMemory:
    """All terms for one GPU of ``stage`` during ``phase``; ``ep`` overrides the plan's EP."""
    par, prec, m = plan.parallelism, plan.precision, plan.model
    params = gpu_params(plan, stage, phase.role, ep)
    ep = ep or par.ep
    expert_shard = max(1.0, par.train_gpus / (par.pp * ep * par.etp)) if par.distributed_optimizer else 1.0
    dense_shard = par.derived_dp * par.cp if par.distributed_optimizer else 1
    opt_params = params.expert / expert_shard + params.dense / dense_shard
    tokens = binding_tokens_per_gpu(plan)
    n_gdn, _ = stage_layer_kinds(plan, stage)
    last = stage == par.pp - 1
    staged_tokens = plan.batch.samples_per_step * plan.batch.mean_sample_tokens // (par.derived_dp * par.cp)
    terms = {
        "weights": (params.expert + params.dense) * prec.param_bytes,
        "grads": (params.expert + params.dense) * prec.main_grad_bytes,
        "optimizer": int(opt_params * prec.optimizer_bytes_per_param * (1 - prec.optimizer_offload_fraction)),
        "activations": activation_bytes(plan, stage),
        # Each stage stages the rows of its own MoE layers for replay.
        "routing_replay": routing_record_bytes(staged_tokens, plan.layers_per_stage, m.moe_router_topk)
        if phase.routing_staged else 0,
        "offload_residue": cal.OFFLOADED_ROLE_RESIDUE_BYTES if phase.residue else 0,
        "allocator_reserve": cal.ALLOCATOR_RESERVE_BYTES,
        "logits_buffer": logits_buffer_bytes(tokens, m.vocab_size, par.tp) if last and phase.role == "actor" else 0,
        "gdn_activation": gdn_activation_bytes(tokens * par.cp, par.cp, prec.gdn_native_cp) if n_gdn else 0,
    }
    return StageMemory(phase.name, stage, terms)


def failing_allocation_bytes(plan: Plan, transient: str) -> int:
    """Size of the single allocation that completes a transient's peak.

    GatedDeltaNet: the bf16 [tokens, value heads x head dim] projection (report 08:
    the 56-GPU crash asked for 632 MiB = 40,448 x 8,192 x 2 B). Logits: the fp32
    upcast [tokens/CP, vocab/TP].
    """
    m, par = plan.model, plan.parallelism
    tokens = binding_tokens_per_gpu(plan)
    if transient == "gdn_activation":
        gdn_tokens = tokens if plan.precision.gdn_native_cp else tokens * par.cp
        return gdn_tokens * m.gdn_num_value_heads * m.gdn_head_dim * plan.precision.param_bytes
    return tokens * math.ceil(m.vocab_size / par.tp) * 4


@dataclass
class MemoryEstimate:
    """The worst stage of every phase, and the first phase (in execution order) that does not fit."""

    capacity_bytes: int
    by_phase: list[StageMemory]
    failing_request_bytes: int = 0

    @property
    def binding(self) -> StageMemory:
        over = [s for s in self.by_phase if s.peak_bytes > self.capacity_bytes]
        return over[0] if over else max(self.by_phase, key=lambda s: s.peak_bytes)

    @property
    def fits(self) -> bool:
        return self.binding.peak_bytes <= self.capacity_bytes

    @property
    def in_use_at_failure_bytes(self) -> int:
        """What PyTorch reports as allocated when the failing request is made."""
        b = self.binding
        return b.peak_bytes - b.terms["allocator_reserve"] - self.failing_request_bytes


def estimate(plan: Plan, ep: int | None = None) -> MemoryEstimate:
    """Per-GPU memory of every phase at its worst pipeline stage."""
    worst = []
    for phase in phases(plan):
        stages = [stage_memory(plan, phase, s, ep) for s in range(plan.parallelism.pp)]
        worst.append(max(stages, key=lambda s: s.peak_bytes))
    est = MemoryEstimate(int(plan.hardware.gpu_memory_gib * cal.GIB), worst)
    est.failing_request_bytes = failing_allocation_bytes(plan, est.binding.binding_transient)
    return est
