"""Gradient reduction, global norm and clipping across a megatron layout.

After a rank's micro-batches have accumulated their gradients (each loss
already weighted by the whole batch's reduction weights, so sums are right):

- sequence-parallel replicas (norms, router: marked ``sequence_parallel``)
  saw only this rank's slice of the sequence, and the q/k norms only this
  rank's heads: summed over the TP group;
- dense parameters: summed over the data-parallel group (with the context-parallel ranks, which
  hold the same weights and saw other positions of the same samples, rl.trainer.context);
- experts: summed over the expert-data-parallel group (ranks holding the
  same experts; with ep = 1 and tp > 1 that includes the TP peers, which
  routed different sequence slices through them).

The global norm counts every distinct tensor once: each local squared norm is
divided by its number of identical copies in the world, then summed over the
world. Clipping then matches ``torch.nn.utils.clip_grad_norm_`` exactly.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch
import torch.distributed as dist

from rl.trainer.shard import is_expert


def _groups():
    from megatron.core import parallel_state as ps

    return ps


def _all_reduce_flat(tensors: list[torch.Tensor], group, size: int) -> None:
    if size == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def _tp_partial(name: str, param: torch.Tensor) -> bool:
    """Replicated over TP but fed only part of the work per TP rank: sequence-parallel replicas, and the
    per-head q/k norms and GatedDeltaNet's output norm (each TP rank normalises its own heads), as megatron's
    finalize_model_grads."""
    return (getattr(param, "sequence_parallel", False) or "q_layernorm" in name or "k_layernorm" in name
            or "self_attention.out_norm" in name)  # GatedDeltaNet's per-head output norm (rl.model.qwen35)


def reduce_grads(model: torch.nn.Module) -> None:
    """Sum partial gradients over the groups that share each parameter (see module docstring)."""
    ps = _groups()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for _, p in named:  # a rank whose expert saw no token still joins the collective
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    tp = ps.get_tensor_model_parallel_world_size()
    _all_reduce_flat([p.grad for n, p in named if _tp_partial(n, p)], ps.get_tensor_model_parallel_group(), tp)
    # context-parallel ranks hold the same dense weights and saw other tokens: summed with the DP ranks
    _all_reduce_flat([p.grad for n, p in named if not is_expert(n)], ps.get_data_parallel_group(with_context_parallel=True),
                     ps.get_data_parallel_world_size(with_context_parallel=True))
    _all_reduce_flat([p.grad for n, p in named if is_expert(n)], ps.get_expert_data_parallel_group(),
                     ps.get_expert_data_parallel_world_size())


def copies(name: str, param: torch.Tensor) -> int:
    """Ranks holding this exact tensor (after :func:`reduce_grads` they hold the same gradient)."""
    ps = _groups()
    if is_expert(name):
        return ps.get_expert_data_parallel_world_size()
    tp = ps.get_tensor_model_parallel_world_size()
    split = getattr(param, "tensor_model_parallel", False) and tp > 1
    return ps.get_data_parallel_world_size(with_context_parallel=True) * (1 if split else tp)


def comm_device() -> str:
    """Where a small tensor must live for a collective: NCCL needs CUDA, gloo takes CPU."""
    return "cuda" if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"


def global_grad_norm(model: torch.nn.Module) -> float:
    """L2 norm of the whole model's gradient, each distinct tensor counted once."""
    local = sum(float(p.grad.detach().double().pow(2).sum()) / copies(name, p)
                for name, p in model.named_parameters() if p.grad is not None)
    total = torch.tensor([local], dtype=torch.float64, device=comm_device())
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    return float(total.sqrt().item())


def reduce_clip_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Reduce, clip to ``grad_clip`` by the global norm, step, zero grads; return the pre-clip norm.

    A non-finite norm skips the step on every rank alike (the norm is global)."""
    reduce_grads(model)
    norm = global_grad_norm(model)
    if math.isfinite(norm):
        coef = min(1.0, grad_clip / (norm + 1e-6))
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(coef)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


class Tally:
    """Token-weighted mean of per-micro-batch masked means, summed over DP ranks."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}

    def add(self, stats: Mapping[str, float], keys: tuple[str, ...], loss: float) -> None:
        n = stats.get("num_tokens", 0.0)
        self.sums["loss"] = self.sums.get("loss", 0.0) + loss
        self.sums["n"] = self.sums.get("n", 0.0) + n
        for k in keys:
            self.sums[k] = self.sums.get(k, 0.0) + (stats[k] * n if n else 0.0)

    def total(self, group) -> dict[str, float]:
        keys = sorted(self.sums)
        t = torch.tensor([self.sums[k] for k in keys], dtype=torch.float64, device=comm_device())
        dist.all_reduce(t, group=group)
        out = dict(zip(keys, t.cpu().tolist()))
        n = out.pop("n")
        return {k: (v if k == "loss" else (v / n if n else math.nan)) for k, v in out.items()}
