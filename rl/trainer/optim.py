"""Optimizers: AdamW with the report's settings and the learning-rate schedule.

T1 report, section 04: Adam(0.9, 0.98), weight decay 0.1, constant LR; the
critic at a multiple of the actor's LR. As in Megatron, weight decay
applies to matrices only; norms and biases (1-D parameters) are not decayed.
``[trainer]`` adds what verl, SkyRL and prime-rl users expect (docs/campaign.md, "Optimizer"):
a linear warmup and a linear or cosine decay (:func:`lr_factor`, applied to both roles before
each RL step's optimizer steps), several mini-batches per step and gradient-norm clipping.
"""
from __future__ import annotations

import math

import torch

from rl.errors import InputError
from rl.trainer.settings import TrainerSettings


def build_optimizer(model: torch.nn.Module, lr: float, settings: TrainerSettings) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters at constant ``lr``."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise InputError("model has no trainable parameters", argument="model")
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": settings.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr,
                             betas=(settings.adam_beta1, settings.adam_beta2))


def lr_factor(step: int, settings: TrainerSettings) -> float:
    """The multiple of the peak LR at RL step ``step`` (0 for the first): a linear ramp over
    ``lr_warmup_steps``, then 1 (constant) or a linear / cosine decay reaching ``lr_min_ratio`` at
    ``lr_decay_steps`` and holding it."""
    if step < 0:
        raise InputError(f"step must be >= 0, got {step}", argument="step")
    warm = settings.lr_warmup_steps
    if step < warm:
        return (step + 1) / warm
    if settings.lr_schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warm) / max(1, settings.lr_decay_steps - warm))
    floor = settings.lr_min_ratio
    shape = 1.0 - progress if settings.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * shape


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip the gradient norm to ``grad_clip``, step, zero grads; return the pre-clip norm.

    A non-finite norm skips the step (the weights stay as they were) and is
    returned as is, so the caller logs it rather than training on NaN.
    """
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip)) if params else 0.0
    if math.isfinite(norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm
