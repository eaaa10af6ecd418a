"""Trainer hyper-parameters: the ``[trainer]`` section's one declaration (a pydantic model).

``rl`` cannot import ``t1ops``, so the model lives here and ``t1ops.config.TrainerConfig``
extends it with the rank layout (``parallel``); the campaign hands the validated model to
the trainer actors as is (Ray pickles it). Defaults follow the T1 report, section 04: clip
0.2 symmetric, value clip 0.2, gamma = lambda = 1, Adam(0.9, 0.98), weight decay 0.1,
constant LR, one optimizer step per batch, gradient norm clipped at 1.0 (the walkthrough's
``max_grad_norm``). The learning rates are the tiny CPU model's tested values, not the report's
(1e-6 actor, 30x critic for a 122B model): at the report's 30x a tiny critic diverges
(docs/campaign.md, "Learning evidence"). Warmup, a decay schedule and mini-batches are off by
default (``rl.trainer.optim``).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MODES = ("ppo", "grpo")

# Critic-only steps when ``critic_warmup_steps`` is None (T1 report, section 04 and its EV discussion):
# a warm-loaded critic starts near EV 0 and needs 2 re-calibration steps; a cold one began at EV -33.6
# ("residuals carry ~34x the variance of the returns") and "needs tens", paying the deficit down over
# roughly the first half of a 90-step campaign. 10 is the low end of "tens": this repository's value
# head starts at exactly 0 (rl/model/build.py), so its cold EV starts at 0, not -33.6 (docs/campaign.md,
# "Critic warm-up").
WARM_CRITIC_WARMUP_STEPS = 2
COLD_CRITIC_WARMUP_STEPS = 10


class Layout(BaseModel):
    """A trainer layout (docs/parallelism.md); world size = dp * tp * pp * cp. The ``[trainer.parallel]``
    section (``t1ops.config.ParallelConfig``) extends it with the process-group backend."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    dp: int = Field(1, ge=1, le=4096, description="Data-parallel ranks: trajectories are packed to them by token count.")
    tp: int = Field(1, ge=1, le=64, description="Tensor-parallel ranks (megatron-core; > 1 needs sequence_parallel).")
    ep: int = Field(1, ge=1, le=1024, description="Expert-parallel ranks: must divide num_experts and dp*tp (expert tensor parallelism is 1).")
    pp: int = Field(1, ge=1, le=64, description="Pipeline stages: each holds num_layers / pp layers (the first the embedding, the last the head, loss and the critic's value head); micro-batches run a 1F1B schedule (rl.trainer.pipeline, docs/parallelism.md).")
    cp: int = Field(1, ge=1, le=64, description="Context-parallel ranks: each holds a zig-zag slice of every sample's tokens (attention exchanges K/V, GatedDeltaNet passes its states; docs/parallelism.md).")
    sequence_parallel: bool = Field(False, description="Split the sequence over the tensor-parallel ranks (megatron SP); requires tp > 1.")
    max_tokens_per_gpu: int = Field(8192, ge=16, description="Token cap of one micro-batch (padded tokens) on one rank; a longer sample is its own micro-batch.")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def sp_size(self) -> int:
        return self.tp if self.sequence_parallel else 1


class TrainerSettings(BaseModel):
    """What one trainer step needs; unknown keys and out-of-range values are errors."""

    # as every config section (t1ops.config.Section): an inf value would silently disable a bound
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    mode: Literal["ppo", "grpo"] = Field("ppo", description="PPO with a critic and GAE, or GRPO with DPPO.")
    actor_lr: float = Field(3e-4, gt=0, le=1.0, description="Actor peak learning rate (the tiny model's tested value: at 7e-4 its held-out reward fell; the report's 122B model: 1e-6).")
    critic_lr_multiplier: float = Field(1.5, gt=0, le=1000, description="Critic LR as a multiple of the actor's (the report: 30x at a 1e-6 actor LR; a tiny critic at 30 x 7e-4 diverges, hence 1.5).")
    lr_warmup_steps: int = Field(0, ge=0, le=100_000, description="RL steps over which both learning rates ramp linearly up to their peak (0: none, as the report).")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field("constant", description="Learning rate after warmup: 'constant' (the report), or a 'linear' / 'cosine' decay to lr_min_ratio x peak at lr_decay_steps.")
    lr_decay_steps: int | None = Field(None, ge=1, description="RL step at which a linear or cosine decay reaches its floor (warmup included); required by those schedules.")
    lr_min_ratio: float = Field(0.0, ge=0, le=1, description="Floor of a decaying schedule as a fraction of the peak LR.")
    mini_batches: int = Field(1, ge=1, le=1024, description="Optimizer steps per RL step and epoch: the batch's prompt groups are split into this many mini-batches, each its own clipped step (the walkthrough's train_batch_size / mini_batch_size); 1: one step per batch (the report).")
    critic_warmup_steps: int | None = Field(0, ge=0, description="Critic-only steps before the actor updates (report: 2, after a warm-loaded critic). None: by the critic's start (critic_only_steps): 2 after critic_warm_load, COLD_CRITIC_WARMUP_STEPS on a cold critic. The campaign's [trainer] defaults to None; this library's step defaults to 0.")
    critic_warm_load: str | None = Field(None, description="Warm-load the critic from a checkpoint: a critic step dir (checkpoints/critic/step_N) or a critic role dir (its newest step) of an earlier run; None: a fresh critic (T1 report section 04: warm-loaded, then critic_warmup_steps critic-only steps).")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    clip_low: float = Field(0.2, ge=0, le=1, description="PPO ratio clip below 1.")
    clip_high: float = Field(0.2, ge=0, le=10, description="PPO ratio clip above 1.")
    value_clip: float = Field(0.2, ge=0, description="Clip of the value update around pre-update values.")
    dppo_delta: float = Field(0.15, gt=0, le=1, description="DPPO binary-TV threshold (probability difference); the default of both sides.")
    dppo_delta_low: float | None = Field(None, gt=0, le=1, description="DPPO threshold for negative-advantage tokens (probability drop); None: dppo_delta (walkthrough: 0.15).")
    dppo_delta_high: float | None = Field(None, gt=0, le=1, description="DPPO threshold for positive-advantage tokens (probability rise); None: dppo_delta (walkthrough: 0.15).")
    loss_reduction: Literal["token_mean", "seq_mean", "prompt_mean"] = Field("token_mean", description="How per-token losses are reduced.")
    r3: bool = Field(True, description="Replay the rollout's routing in the actor forward (R3).")
    weight_decay: float = Field(0.1, ge=0, le=1, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="Adam beta1.")
    adam_beta2: float = Field(0.98, ge=0, lt=1, description="Adam beta2.")
    grad_clip: float = Field(1.0, gt=0, description="Clip the global gradient norm of each optimizer step to this (the walkthrough's max_grad_norm = 1.0); the pre-clip norm is the step row's actor_grad_norm.")
    ppo_epochs: int = Field(1, ge=1, le=16, description="Passes over each batch.")
    save_every: int = Field(4, ge=1, description="Write the full checkpoint (both roles and the trainer state: a resume point) every N steps and at the last step; the other steps only publish the actor to the engines.")
    warm_start_steps: int = Field(110, ge=0, description="Supervised warm-start steps on task solutions before RL (the report's RL starts from SFT).")
    warm_start_lr: float = Field(3e-3, gt=0, le=1.0, description="Learning rate of the supervised warm start.")
    warm_start_noise: float = Field(0.5, ge=0, lt=1, description="Share of warm-start demonstrations showing another task's solution (an imperfect demonstrator).")
    clip_ratio_c: float | None = Field(None, gt=1, le=100, description="PPO dual clip: a negative-advantage token's loss is at most -clip_ratio_c * A (None: off, as the report).")
    tis_mode: Literal["off", "token", "sequence"] = Field("off", description="Apply truncated importance sampling (trainer vs sampler) per token or per sequence; 'off' records it only (the report).")
    tis_cap: float = Field(2.0, gt=0, le=1000, description="Truncation cap of the TIS weight.")
    grpo_norm_by_std: bool = Field(False, description="GRPO: divide group-centred advantages by the group's std (off: the walkthrough's Dr. GRPO-style centring).")
    advantage_whitening: bool = Field(False, description="PPO: whiten GAE advantages over the batch's tokens (off: the report, 'advantage normalization is not enabled').")
    gap_reducer: Literal["token_mean"] = Field("token_mean", description="Reducer of the train-vs-rollout log-prob gap, self-checked against the direct token mean on every step (rl.metrics.checked_logprob_gap); the chaos harness alone selects a wrong one (docs/failures.md, metrics-reducer).")

    @model_validator(mode="after")
    def _schedule(self) -> "TrainerSettings":
        if self.lr_schedule != "constant" and self.lr_decay_steps is None:
            raise ValueError(f"trainer.lr_schedule = '{self.lr_schedule}' decays to trainer.lr_min_ratio at "
                             "trainer.lr_decay_steps: set it (e.g. to run.steps), or lr_schedule = 'constant'")
        if self.lr_decay_steps is not None and self.lr_decay_steps <= self.lr_warmup_steps:
            raise ValueError(f"trainer.lr_decay_steps ({self.lr_decay_steps}) must be above "
                             f"trainer.lr_warmup_steps ({self.lr_warmup_steps}): the decay starts after warmup")
        return self

    @property
    def dppo_deltas(self) -> tuple[float, float]:
        """(delta_low, delta_high) of the DPPO mask; each defaults to ``dppo_delta``."""
        low = self.dppo_delta if self.dppo_delta_low is None else self.dppo_delta_low
        high = self.dppo_delta if self.dppo_delta_high is None else self.dppo_delta_high
        return low, high

    def critic_only_steps(self) -> int:
        """The critic-only steps this trainer takes before its actor moves (GRPO: none, no critic)."""
        if self.mode != "ppo":
            return 0
        if self.critic_warmup_steps is not None:
            return self.critic_warmup_steps
        return WARM_CRITIC_WARMUP_STEPS if self.critic_warm_load else COLD_CRITIC_WARMUP_STEPS

    @property
    def critic_lr(self) -> float:
        """The critic's LR: a multiple of the actor's (its target is a supervised regression)."""
        return self.actor_lr * self.critic_lr_multiplier
