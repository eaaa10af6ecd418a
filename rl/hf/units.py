"""Conversion units: one megatron tensor and the Hugging Face tensors it becomes (both directions).

A :class:`Unit` is the smallest piece a conversion needs whole: ``split`` turns the megatron tensor
into its HF tensors, ``merge`` is the inverse, each a reshape/split/concat (bit-exact both ways).
A weight transfer split into buckets never splits a unit, so each bucket converts on its own.
The per-architecture lists of units are :mod:`rl.hf.qwen3_moe` and :mod:`rl.hf.qwen3_5_moe`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Unit:
    """One megatron tensor <-> its Hugging Face tensors (``split`` then ``merge`` is the identity)."""

    mcore: str
    hf: tuple[str, ...]
    split: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    merge: Callable[[tuple[torch.Tensor, ...]], torch.Tensor]


def same(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (t,)


def one(ts: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return ts[0]


def plain(mcore: str, hf: str) -> Unit:
    """A tensor that is the same on both sides under another name."""
    return Unit(mcore, (hf,), same, one)


def concat(mcore: str, hf: tuple[str, ...], sizes: tuple[int, ...]) -> Unit:
    """A megatron tensor that stacks the HF tensors along dim 0 (sizes: their rows)."""

    def split(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(p.contiguous() for p in torch.split(t, list(sizes), dim=0))

    def merge(ts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.cat(ts, dim=0).contiguous()

    return Unit(mcore, hf, split, merge)


def swiglu(mcore: str, hf_prefix: str, rows: int) -> Unit:
    """megatron's SwiGLU ``linear_fc1`` = ``[gate; up]`` <-> HF ``gate_proj`` and ``up_proj``."""
    return concat(mcore, (hf_prefix + "gate_proj.weight", hf_prefix + "up_proj.weight"), (rows, rows))


def grouped_qkv(mcore: str, hf: tuple[str, ...], groups: int, per_group: int, dim: int, gated: bool) -> Unit:
    """megatron's fused ``linear_qkv``, grouped by query group: ``[G, (P [+ P gate] + 2), D, hidden]``
    (the group's P query heads, with an output gate their P gate heads, its key head, its value head).

    HF keeps ``q_proj`` ``[H*D, hidden]`` (gated: ``[H*2D, hidden]``, each head's query then its gate,
    Qwen3.5's layout), ``k_proj``/``v_proj`` ``[G*D, hidden]``.
    """
    q_heads = per_group * (2 if gated else 1)

    def split(qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = qkv.shape[-1]
        w = qkv.reshape(groups, q_heads + 2, dim, hidden)
        q = w[:, :per_group]
        if gated:  # per head: [query D rows; gate D rows]
            q = torch.stack([q, w[:, per_group:q_heads]], dim=2)
        return (q.reshape(-1, hidden).contiguous(), w[:, q_heads].reshape(groups * dim, hidden).contiguous(),
                w[:, q_heads + 1].reshape(groups * dim, hidden).contiguous())

    def merge(ts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        q, k, v = ts
        hidden = q.shape[-1]
        if gated:
            qg = q.reshape(groups, per_group, 2, dim, hidden)
            q = torch.cat([qg[:, :, 0], qg[:, :, 1]], dim=1)
        else:
            q = q.reshape(groups, per_group, dim, hidden)
        w = torch.cat([q, k.reshape(groups, 1, dim, hidden), v.reshape(groups, 1, dim, hidden)], dim=1)
        return w.reshape(-1, hidden).contiguous()

    return Unit(mcore, hf, split, merge)
