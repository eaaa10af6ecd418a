"""One update of the critic and one of the actor (pure orchestration over rl core).

T1 report, section 03: the critic runs first; its pre-update values feed
both GAE and its own clipped value loss. The actor then recomputes old
log-probs under the behaviour snapshot (done by the caller) and takes the
clipped step. GRPO mode (SkyRL walkthrough, section 6): group-centred
advantages, the DPPO binary-TV mask against the per-token rollout log-probs.
Every actor forward runs at the sampling temperature; with ``tis_mode`` on,
the per-token loss is multiplied by the (detached) TIS weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.advantages import compute_gae, grpo_trajectory_advantages, whiten_advantages
from rl.errors import InputError
from rl.losses import dppo_loss, ppo_clip_loss, reduce_loss, value_loss
from rl.metrics import explained_variance
from rl.trainer.batch import TrainBatch
from rl.trainer.forward import actor_logprobs, critic_values
from rl.trainer.optim import clip_and_step
from rl.trainer.settings import TrainerSettings


@dataclass(frozen=True)
class BehaviourPlan:
    """Which log-probs play which part in a step, for every rank layout (1 rank included).

    ``behaviour="snapshot"``: old log-probs are recomputed under the behaviour snapshot (the
    published weights that sampled the batch). ``behaviour="rollout"`` (fully async,
    docs/async.md): a trajectory may span versions, so the per-token rollout log-probs are the
    behaviour (the PPO ratio's denominator); TIS is then recorded, not applied on top."""

    recompute: bool           # old log-probs recomputed by the trainer (PPO, or TIS applied)
    ratio_from_rollout: bool  # the PPO ratio's denominator is the rollout's log-probs
    apply_tis: bool           # TIS weights multiply the per-token loss


def behaviour_plan(s: TrainerSettings, behaviour: str) -> BehaviourPlan:
    if behaviour not in ("snapshot", "rollout"):
        raise InputError(f"behaviour must be 'snapshot' or 'rollout', got {behaviour!r}", argument="behaviour")
    return BehaviourPlan(recompute=s.mode == "ppo" or s.tis_mode != "off",
                         ratio_from_rollout=behaviour == "rollout",
                         apply_tis=s.tis_mode != "off" and behaviour != "rollout")


@dataclass
class CriticUpdate:
    """What the critic step hands to the actor step, plus its stats."""

    advantages_BT: torch.Tensor
    returns_BT: torch.Tensor
    explained_variance: float  # of the pre-update values against the GAE returns
    value_loss: float
    grad_norm: float
    value_clip_fraction: float


@dataclass
class ActorUpdate:
    policy_loss: float
    grad_norm: float
    clip_fraction: float  # PPO: clipped-branch share; GRPO: DPPO TV-masked share
    ratio_mean: float
    dual_clip_fraction: float
    first_logprobs_BT: torch.Tensor  # detached log-probs of the first epoch's forward (current weights)
    entropy: float = float("nan")    # token mean over loss tokens of the first forward's entropy (no grad)


def critic_step(critic, optimizer, batch: TrainBatch, s: TrainerSettings) -> CriticUpdate:
    """Pre-update values -> GAE; then ``ppo_epochs`` clipped value-loss steps anchored to them."""
    mask_BT = batch.loss_mask_BT
    with torch.no_grad():
        old_values_BT = critic_values(critic, batch)
    advantages_BT, returns_BT = compute_gae(batch.rewards_B, old_values_BT, mask_BT, s.gamma, s.lam)
    ev = explained_variance(old_values_BT, returns_BT, mask_BT)
    if s.advantage_whitening:  # the returns (critic targets) stay raw
        advantages_BT = whiten_advantages(advantages_BT, mask_BT)
    critic.train()
    for _ in range(s.ppo_epochs):
        loss_BT, stats = value_loss(critic_values(critic, batch), old_values_BT, returns_BT, mask_BT,
                                    clip=s.value_clip)
        loss = reduce_loss(loss_BT, mask_BT, s.loss_reduction, batch.prompt_ids)
        loss.backward()
        grad_norm = clip_and_step(critic, optimizer, s.grad_clip)
    return CriticUpdate(advantages_BT, returns_BT, float(ev), float(loss.detach()), grad_norm,
                        stats["clip_fraction"])


def grpo_token_advantages(batch: TrainBatch, norm_by_std: bool = False) -> torch.Tensor:
    """Group-centred advantage per trajectory, ``[B]`` (a trajectory's chunks count once in the
    group baseline and share its advantage; row-less ``baseline_only`` trajectories count too);
    divided by the group std when ``norm_by_std`` (off by default, as the walkthrough)."""
    tids = batch.trajectory_ids if batch.trajectory_ids is not None else list(range(batch.num_samples))
    return grpo_trajectory_advantages(batch.rewards_B, batch.group_ids, tids, norm_by_std=norm_by_std,
                                      baseline_only=batch.baseline_only or ())


def actor_step(actor, optimizer, batch: TrainBatch, advantages: torch.Tensor,
               old_logprobs_BT: torch.Tensor | None, s: TrainerSettings, *, temperature: float = 1.0,
               tis_BT: torch.Tensor | None = None) -> ActorUpdate:
    """``ppo_epochs`` clipped steps: PPO against ``old_logprobs_BT``, or DPPO against the rollout's.

    ``tis_BT`` (None: not applied) multiplies the per-token loss."""
    mask_BT = batch.loss_mask_BT
    actor.train()
    first, entropy = None, float("nan")
    for _ in range(s.ppo_epochs):
        if first is None:
            logprobs_BT, entropy_BT = actor_logprobs(actor, batch, replay=s.r3, temperature=temperature,
                                                     with_entropy=True)
            first, entropy = logprobs_BT.detach(), masked_token_mean(entropy_BT, mask_BT)
        else:
            logprobs_BT = actor_logprobs(actor, batch, replay=s.r3, temperature=temperature)
        if s.mode == "ppo":
            loss_BT, stats = ppo_clip_loss(logprobs_BT, old_logprobs_BT, advantages, mask_BT,
                                           s.clip_low, s.clip_high, s.clip_ratio_c)
            clip_fraction = stats["clip_fraction"]
        else:
            loss_BT, stats = dppo_loss(logprobs_BT, batch.rollout_logprobs_BT, advantages, mask_BT,
                                       *s.dppo_deltas)
            clip_fraction = stats["tv_masked_fraction"]
        if tis_BT is not None:
            loss_BT = loss_BT * tis_BT
        loss = reduce_loss(loss_BT, mask_BT, s.loss_reduction, batch.prompt_ids)
        loss.backward()
        grad_norm = clip_and_step(actor, optimizer, s.grad_clip)
    return ActorUpdate(float(loss.detach()), grad_norm, clip_fraction, stats["ratio_mean"],
                       stats.get("dual_clip_fraction", float("nan")), first, entropy)


def masked_token_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """Mean of ``x`` over the loss-bearing tokens (NaN when there is none)."""
    n = int(mask_BT.sum())
    return float(x_BT.detach()[mask_BT].sum() / n) if n else float("nan")
