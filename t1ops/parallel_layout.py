"""Layout rules for a trainer's parallelism: one source of truth for plans and campaigns.

Preflight's plan files (:class:`t1ops.preflight.plan.Parallelism`) and a
campaign's ``[trainer.parallel]`` (:class:`t1ops.config.ParallelConfig`) both
validate their layout with :func:`layout_errors`; each rule returns the
message a user sees, with the arithmetic and the fix. Pure functions, no
imports from the rest of t1ops (the config and preflight both import this).

Megatron-core's ordering is ``tp-cp-ep-dp-pp``: the dense layers use
``world = tp * cp * dp * pp``; the experts use ``world = etp * ep * edp * pp``
(``edp`` the expert-data-parallel size), so ``pp * ep * etp`` must divide the
world (docs/parallelism.md).
"""
from __future__ import annotations


def dense_divides(world: int, tp: int, pp: int, cp: int) -> str | None:
    """The dense layers need world = tp * pp * cp * dp with an integer dp."""
    dense = tp * pp * cp
    if world % dense:
        return f"train_gpus {world} is not divisible by tp*pp*cp = {dense}"
    return None


def expert_fits(world: int, pp: int, etp: int) -> str | None:
    """Some expert layout (at least ep = 1) must fit in the world."""
    if pp * etp > world:
        return (f"pp*etp = {pp * etp} exceeds train_gpus {world}: no expert layout fits; lower etp or pp")
    return None


def dp_matches(world: int, tp: int, pp: int, cp: int, dp: int | None) -> str | None:
    """A requested dp must be the derived one: world / (tp * pp * cp)."""
    dense = tp * pp * cp
    if dp is not None and world % dense == 0 and dp != world // dense:
        return (f"dp = {dp} but train_gpus/(tp*pp*cp) = {world // dense}; change train_gpus, tp, pp or cp "
                "so they agree (dp is derived)")
    return None


def layers_split(num_layers: int, pp: int) -> str | None:
    """Every pipeline stage holds the same number of layers."""
    if num_layers % pp:
        return f"num_layers {num_layers} is not divisible by pp {pp}"
    return None


def expert_layout(world: int, pp: int, ep: int, etp: int, num_experts: int) -> str | None:
    """ep divides the experts, and pp * ep * etp divides the world (integer expert-data-parallel size)."""
    if num_experts % ep:
        return f"ep = {ep} does not divide num_experts {num_experts}: every expert-parallel rank holds the same count"
    if world % (pp * ep * etp):
        return (f"ep = {ep} needs train_gpus divisible by pp*ep*etp = {pp * ep * etp}; {world} is not "
                "(the expert-data-parallel size would not be an integer)")
    return None


def heads_split(num_attention_heads: int, tp: int, num_query_groups: int | None = None) -> str | None:
    """Tensor parallelism splits the attention heads and the key/value groups."""
    if num_attention_heads % tp:
        return f"tp = {tp} does not divide num_attention_heads {num_attention_heads}"
    if num_query_groups is not None and num_query_groups % tp:
        return f"tp = {tp} does not divide num_query_groups {num_query_groups} (each TP rank holds whole KV groups)"
    return None


def moe_tp_needs_sp(tp: int, sequence_parallel: bool) -> str | None:
    """megatron-core refuses to train an MoE layer with tp > 1 and sequence parallelism off."""
    if tp > 1 and not sequence_parallel:
        return (f"tp = {tp} with sequence_parallel = false: megatron-core refuses MoE training with tensor "
                "parallelism and no sequence parallelism; set sequence_parallel = true")
    return None


def sp_needs_tp(tp: int, sequence_parallel: bool) -> str | None:
    """Sequence parallelism shards along the tensor-parallel group; with tp = 1 it does nothing."""
    if sequence_parallel and tp == 1:
        return "sequence_parallel = true needs tp > 1 (it splits the sequence over the tensor-parallel ranks)"
    return None


def plan_errors(world: int, tp: int, pp: int, cp: int, etp: int, dp: int | None) -> list[str]:
    """The structural rules a preflight plan's ``[parallelism]`` must satisfy on its own."""
    return [m for m in (dense_divides(world, tp, pp, cp), expert_fits(world, pp, etp),
                        dp_matches(world, tp, pp, cp, dp)) if m]


def trainer_errors(*, dp: int, tp: int, pp: int, ep: int, sequence_parallel: bool, num_layers: int,
                   num_experts: int, num_attention_heads: int, num_query_groups: int | None = None,
                   etp: int = 1, cp: int = 1) -> list[str]:
    """Every rule a campaign's ``[trainer.parallel]`` must satisfy against its model (world = dp*tp*pp*cp)."""
    world = dp * tp * pp * cp
    rules = (plan_errors(world, tp, pp, cp, etp, dp)
             + [layers_split(num_layers, pp), expert_layout(world, pp, ep, etp, num_experts),
                heads_split(num_attention_heads, tp, num_query_groups), moe_tp_needs_sp(tp, sequence_parallel),
                sp_needs_tp(tp, sequence_parallel)])
    return [m for m in rules if m]
