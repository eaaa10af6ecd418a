"""Optimizers: AdamW with the report's settings and a constant learning rate.

T1 report, section 04: Adam(0.9, 0.98), weight decay 0.1, constant LR; the
critic at a multiple (30x) of the actor's LR. As in Megatron, weight decay
applies to matrices only; norms and biases (1-D parameters) are not decayed.
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
