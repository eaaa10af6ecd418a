"""Trainer hyper-parameters as a plain dataclass (``rl`` cannot import ``t1ops``).

Field names mirror ``t1ops.config.TrainerConfig`` one for one, so the campaign
builds it with ``TrainerSettings.from_mapping(cfg.trainer.model_dump(exclude={"parallel"}))``; a
test keeps the two in step. Defaults follow the T1 report, section 04: clip
0.2 symmetric, value clip 0.2, gamma = lambda = 1, Adam(0.9, 0.98), weight
decay 0.1, constant LR, critic at 30x the actor's LR.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from rl.errors import ConfigError
from rl.losses import REDUCE_MODES, TIS_MODES

MODES = ("ppo", "grpo")


@dataclass(frozen=True)
class TrainerSettings:
    """What one trainer step needs; see ``t1ops.config.TrainerConfig`` for each field's meaning."""

    mode: str = "ppo"
    actor_lr: float = 1e-3
    critic_lr_multiplier: float = 30.0
    critic_warmup_steps: int = 0
    critic_warm_load: str | None = None
    gamma: float = 1.0
    lam: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    value_clip: float = 0.2
    dppo_delta: float = 0.15
    dppo_delta_low: float | None = None
    dppo_delta_high: float | None = None
    loss_reduction: str = "token_mean"
    r3: bool = True
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    save_every: int = 4
    warm_start_steps: int = 110
    warm_start_lr: float = 3e-3
    warm_start_noise: float = 0.5
    clip_ratio_c: float | None = None
    tis_mode: str = "off"
    tis_cap: float = 2.0
    grpo_norm_by_std: bool = False
    advantage_whitening: bool = False
    gap_reducer: str = "token_mean"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"trainer mode must be one of {MODES}, got {self.mode!r}", key="mode")
        if self.loss_reduction not in REDUCE_MODES:
            raise ConfigError(f"loss_reduction must be one of {REDUCE_MODES}, got {self.loss_reduction!r}",
                              key="loss_reduction")
        for key in ("actor_lr", "critic_lr_multiplier", "grad_clip", "dppo_delta"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key} must be > 0, got {getattr(self, key)!r}", key=key)
        for key in ("gamma", "lam", "adam_beta1", "adam_beta2", "weight_decay"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"{key} must lie in [0, 1], got {getattr(self, key)!r}", key=key)
        from rl.metrics import REDUCERS

        if self.gap_reducer not in REDUCERS:
            raise ConfigError(f"gap_reducer must be one of {sorted(REDUCERS)}, got {self.gap_reducer!r}",
                              key="gap_reducer")
        if self.tis_mode not in TIS_MODES:
            raise ConfigError(f"tis_mode must be one of {TIS_MODES}, got {self.tis_mode!r}", key="tis_mode")
        if not self.tis_cap > 0:
            raise ConfigError(f"tis_cap must be > 0, got {self.tis_cap!r}", key="tis_cap")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ConfigError(f"clip_ratio_c (dual clip) must be > 1 or unset, got {self.clip_ratio_c!r}",
                              key="clip_ratio_c")
        if self.ppo_epochs < 1 or self.critic_warmup_steps < 0:
            raise ConfigError(f"ppo_epochs must be >= 1 and critic_warmup_steps >= 0, got "
                              f"{self.ppo_epochs} and {self.critic_warmup_steps}", key="ppo_epochs")

    @property
    def dppo_deltas(self) -> tuple[float, float]:
        """(delta_low, delta_high) of the DPPO mask; each defaults to ``dppo_delta``."""
        low = self.dppo_delta if self.dppo_delta_low is None else self.dppo_delta_low
        high = self.dppo_delta if self.dppo_delta_high is None else self.dppo_delta_high
        return low, high

    @property
    def critic_lr(self) -> float:
        """The critic's LR: a multiple of the actor's (its target is a supervised regression)."""
        return self.actor_lr * self.critic_lr_multiplier

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "TrainerSettings":
        """Build from a dict (e.g. ``TrainerConfig.model_dump()``); an unknown key is an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown trainer setting(s) {unknown}; known: {sorted(known)}. "
                              "Add the field to rl.trainer.settings.TrainerSettings too.", keys=unknown)
        return cls(**dict(values))
