"""The 1-rank trainer: :class:`~rl.trainer.ranks.RankTrainer` in a world of 1.

There is one implementation of the step (``RankTrainer.train_step``); this
class builds it in a one-process megatron world (``rl.megatron_cpu``) with
seeded initial weights, and adds the whole-model conveniences a single
process can offer (full states, warm load, weight-only resume). A degree of
1 means "off", as in torchtitan's trainer: no second code path.

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

from typing import Mapping

import torch

from rl import model as rmodel
from rl.errors import InputError
from rl.trainer.ranks import Layout, RankTrainer
from rl.trainer.settings import TrainerSettings
from rl.trainer.step import StepStats, copy_state

__all__ = ["Trainer", "StepStats", "copy_state"]


class Trainer(RankTrainer):
    """Actor (+ critic in PPO mode) with their optimizers in a world of 1; see the module docstring.

    ``max_tokens_per_gpu`` cuts a step's batch into micro-batches (gradient accumulation), as on
    every rank of a larger layout (``trainer.parallel.max_tokens_per_gpu``)."""

    def __init__(self, spec: rmodel.ModelSpec, settings: TrainerSettings, *, seed: int = 0,
                 unk_id: int | None = None, temperature: float = 1.0, max_tokens_per_gpu: int = 8192) -> None:
        from rl.megatron_cpu import init_single_process

        init_single_process()  # idempotent: a host that made its world of 1 with its own timeout keeps it
        super().__init__(spec, settings, Layout(max_tokens_per_gpu=max_tokens_per_gpu), full_actor=None,
                         full_critic=None, unk_id=unk_id, seed=seed, temperature=temperature)

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
        if critic_state is not None and self.critic is None:
            raise InputError("GRPO mode has no critic to warm-load", argument="critic_state")
        self.load_full(actor=actor_state, critic=critic_state)

    def load_weights(self, actor_state: Mapping[str, torch.Tensor],
                     critic_state: Mapping[str, torch.Tensor] | None, step: int) -> None:
        """Resume from weights only (the report's checkpoints carry no optimizer state)."""
        if self.critic is not None and critic_state is None:
            raise InputError("PPO mode needs the critic's weights to resume", argument="critic_state")
        self.load_full(actor=actor_state, critic=critic_state if self.critic is not None else None, step=step)
