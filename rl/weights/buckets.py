"""The Hugging Face tensors of a policy state, cut into transfer buckets.

A bucket is what one ``/update_weights_from_distributed`` request carries (SGLang loads each
request on its own, so memory on both sides is bounded by the bucket, not the model). Buckets
hold whole conversion units (:class:`rl.hf.units.Unit`), so a receiver that keeps
megatron's layout (the embedded engine) converts every bucket on its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from rl.hf import layout
from rl.model import ModelSpec
from rl.weights.group import dtype_name


@dataclass(frozen=True)
class Bucket:
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    num_bytes: int


def hf_buckets(state: Mapping[str, torch.Tensor], spec: ModelSpec, dtype: torch.dtype,
               bucket_bytes: int) -> list[tuple[Bucket, list[torch.Tensor]]]:
    """``state`` (megatron names) as Hugging Face tensors cast to ``dtype``, in buckets of about
    ``bucket_bytes`` (a unit larger than that gets a bucket of its own)."""
    out: list[tuple[Bucket, list[torch.Tensor]]] = []
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    size = 0

    def flush() -> None:
        nonlocal names, tensors, size
        if names:
            out.append((Bucket(tuple(names), tuple(dtype_name(t.dtype) for t in tensors),
                               tuple(tuple(t.shape) for t in tensors), size), tensors))
        names, tensors, size = [], [], 0

    for unit in layout.units(spec):
        pieces = [p.to(dtype).contiguous() for p in unit.split(state[unit.mcore].detach())]
        unit_bytes = sum(p.numel() * p.element_size() for p in pieces)
        if names and size + unit_bytes > bucket_bytes:
            flush()
        names += unit.hf
        tensors += pieces
        size += unit_bytes
    flush()
    return out
