"""The trainer: a megatron-core actor, a same-shape critic (PPO), and their step.

Step order (T1 report, section 03): critic first, then the actor. The first
``critic_warmup_steps`` steps move only the critic (PPO only: GRPO has no
critic to warm up, so the setting neither freezes its actor nor builds one).
Logged each step (a :class:`StepStats`): explained variance, the
train-vs-rollout log-prob gap (``rl.metrics.logprob_gap``, one token-mean over
the whole batch), clip fraction, TIS (recorded; applied when ``tis_mode`` is
not "off"), grad norms, tokens. Every actor forward runs at the sampling
temperature the trainer was built with (the engine's log-probs are
temperature-scaled).

GRPO/DPPO's ratio is against the rollout log-probs, so when TIS is not
applied nothing needs the behaviour recompute: it is skipped, and the gap and
TIS stats are measured on the first epoch's forward of the current weights.

The behaviour snapshot: the PPO ratio's denominator is the policy that really
sampled the batch. In a one-step pipeline that is not the trainer's current
weights, so the campaign calls :meth:`Trainer.snapshot_behaviour` inside the
weight-sync barrier, when it publishes weights; old log-probs are then
recomputed under those weights. Without a snapshot the current weights are
the behaviour policy (synchronous loop).

Fully async (``behaviour="rollout"``, docs/async.md): a trajectory may span
several weight versions, so no snapshot is the policy that sampled it; the
per-token ``rollout_logprobs`` are the behaviour log-probs (the PPO ratio's
denominator; GRPO's DPPO mask always uses them). TIS and the log-prob gap then
compare the trainer's current weights (the proximal policy) with the rollout.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator, Mapping

import torch

from rl import model as rmodel
from rl.errors import InputError
from rl.losses import tis_weights
from rl.metrics import checked_logprob_gap
from rl.trainer.batch import TrainBatch
from rl.trainer.forward import actor_logprobs
from rl.trainer.optim import build_optimizer
from rl.trainer.settings import TrainerSettings
from rl.trainer.sft import SftStats, sft_update
from rl.trainer.step import actor_step, behaviour_plan, critic_step, grpo_token_advantages


@dataclass
class StepStats:
    """One RL step's numbers (NaN where a quantity does not exist in this mode or step)."""

    step: int
    mode: str
    actor_updated: bool
    num_samples: int
    num_tokens: int  # loss-bearing tokens
    reward_mean: float
    explained_variance: float
    logprob_gap: float
    clip_fraction: float
    ratio_mean: float
    policy_loss: float
    value_loss: float
    actor_grad_norm: float
    critic_grad_norm: float
    tis_mean: float
    tis_max_raw: float
    tis_clip_fraction: float
    advantage_mean: float
    dual_clip_fraction: float = math.nan
    tis_mode: str = "off"             # "off": recorded only; "token"/"sequence": applied to the loss
    behaviour_recomputed: bool = True  # False: GRPO without TIS skipped the old-log-prob forward
    entropy: float = math.nan          # policy entropy over loss tokens, logged without gradient

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def copy_state(state: Mapping[str, object]) -> dict[str, object]:
    """A detached copy of a state_dict (megatron's holds ``_extra_state: None`` entries too)."""
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


@contextlib.contextmanager
def _weights(model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None) -> Iterator[None]:
    """Run the block with ``state`` loaded into ``model``, then restore its own weights."""
    if state is None:
        yield
        return
    own = copy_state(model.state_dict())
    model.load_state_dict(state)
    try:
        yield
    finally:
        model.load_state_dict(own)


class Trainer:
    """Actor (+ critic in PPO mode) with their optimizers; see the module docstring."""

    def __init__(self, spec: rmodel.ModelSpec, settings: TrainerSettings, *, seed: int = 0,
                 unk_id: int | None = None, temperature: float = 1.0) -> None:
        if not temperature >= 0:
            raise InputError(f"temperature must be >= 0, got {temperature!r}", argument="temperature")
        self.spec, self.settings = spec, settings
        # greedy sampling (0) reports log-probs of the unscaled distribution, as SGLang does
        self.temperature = temperature if temperature > 0 else 1.0
        self.actor = rmodel.build_policy(spec, seed, torch.float32, unk_id=unk_id)
        self.actor_optimizer = build_optimizer(self.actor, settings.actor_lr, settings)
        self.critic = None
        self.critic_optimizer = None
        if settings.mode == "ppo":
            self.critic = rmodel.build_critic(spec, seed + 1)
            self.critic_optimizer = build_optimizer(self.critic, settings.critic_lr, settings)
        self.step = 0  # RL steps taken (SFT steps are not counted)
        self._behaviour: dict[str, torch.Tensor] | None = None

    # --- the RL step ------------------------------------------------------------
    def train_step(self, batch: TrainBatch, *, behaviour: str = "snapshot") -> StepStats:
        """Critic step (PPO), then the actor's clipped step unless in critic warm-up.

        ``behaviour``: ``"snapshot"`` recomputes old log-probs under the behaviour snapshot;
        ``"rollout"`` takes the per-token rollout log-probs (fully async)."""
        s, plan = self.settings, behaviour_plan(self.settings, behaviour)
        if batch.num_loss_tokens == 0:
            raise InputError("the batch has no loss-bearing token; skip it explicitly rather than "
                             "stepping on nothing", num_samples=batch.num_samples)
        critic = critic_step(self.critic, self.critic_optimizer, batch, s) if s.mode == "ppo" else None
        advantages = critic.advantages_BT if critic else grpo_token_advantages(batch, s.grpo_norm_by_std)
        mask_BT = batch.loss_mask_BT
        recompute = plan.recompute
        old_logprobs_BT, behaviour_entropy = self.behaviour_logprobs(batch, with_entropy=True) \
            if recompute else (None, math.nan)
        tis_BT = None
        if old_logprobs_BT is not None:
            tis_BT, tis = tis_weights(old_logprobs_BT, batch.rollout_logprobs_BT, mask_BT, s.tis_cap,
                                      "token" if s.tis_mode == "off" else s.tis_mode)
        ratio_old_BT = batch.rollout_logprobs_BT if plan.ratio_from_rollout else old_logprobs_BT
        apply_tis = plan.apply_tis
        actor_updated = s.mode != "ppo" or self.step >= s.critic_warmup_steps
        actor = actor_step(self.actor, self.actor_optimizer, batch, advantages, ratio_old_BT, s,
                           temperature=self.temperature, tis_BT=tis_BT if apply_tis else None) \
            if actor_updated else None
        if old_logprobs_BT is None:  # GRPO without TIS: measure on the first epoch's forward
            old_logprobs_BT = actor.first_logprobs_BT
            _, tis = tis_weights(old_logprobs_BT, batch.rollout_logprobs_BT, mask_BT, s.tis_cap, "token")
        gap = checked_logprob_gap(old_logprobs_BT, batch.rollout_logprobs_BT, mask_BT, s.gap_reducer)
        self.step += 1
        adv_BT = advantages if advantages.dim() == 2 else advantages[:, None].expand(mask_BT.shape)
        nan = math.nan
        return StepStats(
            step=self.step, mode=s.mode, actor_updated=actor_updated, num_samples=batch.num_samples,
            num_tokens=batch.num_loss_tokens, reward_mean=float(batch.rewards_B.mean()),
            explained_variance=critic.explained_variance if critic else nan, logprob_gap=float(gap),
            clip_fraction=actor.clip_fraction if actor else nan, ratio_mean=actor.ratio_mean if actor else nan,
            policy_loss=actor.policy_loss if actor else nan, value_loss=critic.value_loss if critic else nan,
            actor_grad_norm=actor.grad_norm if actor else nan,
            critic_grad_norm=critic.grad_norm if critic else nan, tis_mean=tis["tis_mean"],
            tis_max_raw=tis["tis_max_raw"], tis_clip_fraction=tis["tis_clip_fraction"],
            advantage_mean=float(adv_BT[mask_BT].mean()),
            dual_clip_fraction=actor.dual_clip_fraction if actor else nan, tis_mode=s.tis_mode,
            behaviour_recomputed=recompute,
            # the actor's first forward; a critic-only step has none, but its actor has not moved since
            # the behaviour snapshot it was published as, so the behaviour forward is the same policy
            entropy=actor.entropy if actor else behaviour_entropy)

    def behaviour_logprobs(self, batch: TrainBatch, *, with_entropy: bool = False):
        """Old log-probs recomputed by the trainer under the behaviour snapshot (R3 as configured);
        ``with_entropy``: ``(logprobs, token-mean entropy over the loss tokens)``."""
        with torch.no_grad(), _weights(self.actor, self._behaviour):
            out = actor_logprobs(self.actor, batch, replay=self.settings.r3, temperature=self.temperature,
                                 with_entropy=with_entropy)
        if not with_entropy:
            return out
        from rl.trainer.step import masked_token_mean

        return out[0], masked_token_mean(out[1], batch.loss_mask_BT)

    def snapshot_behaviour(self) -> None:
        """Remember the actor's current weights as the policy that samples the next batch."""
        self._behaviour = copy_state(self.actor.state_dict())

    def set_behaviour(self, state: Mapping[str, torch.Tensor] | None) -> None:
        """Use ``state`` (the weights published to the engines that sampled the next batch) as the
        behaviour policy; None means the current weights (a synchronous loop)."""
        self._behaviour = None if state is None else copy_state(state)

    # --- supervised warm start ------------------------------------------------------
    def sft_step(self, tokens, loss_mask) -> SftStats:
        """One supervised step of the actor on token sequences (cross-entropy where loss_mask = 1)."""
        return sft_update(self.actor, self.actor_optimizer, tokens, loss_mask, self.settings.grad_clip)

    # --- weights ---------------------------------------------------------------------
    def actor_state(self) -> dict[str, torch.Tensor]:
        return self.actor.state_dict()

    def critic_state(self) -> dict[str, torch.Tensor] | None:
        return None if self.critic is None else self.critic.state_dict()

    def warm_load(self, *, actor_state: Mapping[str, torch.Tensor] | None = None,
                  critic_state: Mapping[str, torch.Tensor] | None = None) -> None:
        """Start from another run's weights (either role or both); the step count stays at 0,
        so ``critic_warmup_steps`` recalibrate a warm-loaded critic (report: 2 steps)."""
        if actor_state is None and critic_state is None:
            raise InputError("warm_load needs actor_state, critic_state or both", argument="actor_state")
        if actor_state is not None:
            self.actor.load_state_dict(actor_state)
        if critic_state is not None:
            if self.critic is None:
                raise InputError("GRPO mode has no critic to warm-load", argument="critic_state")
            self.critic.load_state_dict(critic_state)
        self._behaviour = None

    def load_weights(self, actor_state: Mapping[str, torch.Tensor],
                     critic_state: Mapping[str, torch.Tensor] | None, step: int) -> None:
        """Resume from weights only (the report's checkpoints carry no optimizer state)."""
        self.actor.load_state_dict(actor_state)
        if self.critic is not None:
            if critic_state is None:
                raise InputError("PPO mode needs the critic's weights to resume", argument="critic_state")
            self.critic.load_state_dict(critic_state)
        self.step = int(step)
        self._behaviour = None
