"""The Hugging Face tensors of a policy state, cut into transfer buckets.

A bucket is what one ``/update_weights_from_distributed`` request carries (SGLang loads each
request on its own, so memory on both sides is bounded by the bucket, not the model). Buckets
hold whole conversion units (:class:`rl.hf.units.Unit`), so a receiver that keeps
megatron's layout (the embedded engine) converts every bucket on its own.

:func:`hf_delta_buckets` cuts a delta (``rl.weights.delta``) the same way: per unit, only the
entries of its pieces that changed since the base version; an unchanged unit is not announced.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from rl.hf import layout
from rl.model import ModelSpec
from rl.weights import delta
from rl.weights.group import dtype_name


@dataclass(frozen=True)
class Bucket:
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    num_bytes: int
    kinds: tuple[str, ...] = ()  # a delta's entry kinds (rl.weights.delta); empty: whole tensors
    channel: int = 0             # the weight-update group it travels on: its owner rank's (rl.weights.shard_plan)


def hf_buckets(state: Mapping[str, torch.Tensor], spec: ModelSpec, dtype: torch.dtype,
               bucket_bytes: int) -> list[tuple[Bucket, list[torch.Tensor]]]:
    """``state`` (megatron names) as Hugging Face tensors cast to ``dtype``, in buckets of about
    ``bucket_bytes`` (a unit larger than that gets a bucket of its own)."""
    def whole(unit):
        pieces = [p.to(dtype).contiguous() for p in unit.split(state[unit.mcore].detach())]
        return [(name, "", p, None) for name, p in zip(unit.hf, pieces)]
    return [(b, [e[2] for e in es]) for b, es in cut([whole(u) for u in layout.units(spec)], bucket_bytes, delta=False)]


def hf_delta_buckets(state: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor], spec: ModelSpec,
                     dtype: torch.dtype, bucket_bytes: int) -> list[tuple[Bucket, list[torch.Tensor]]]:
    """What turns ``base`` into ``state`` on the engines (both megatron states), cast to ``dtype``:
    per unit, the ``rl.weights.delta`` entries of its changed pieces; [] when nothing changed."""
    def changed(unit):
        new = unit.split(state[unit.mcore].detach())
        old = unit.split(base[unit.mcore].detach())
        return [(name, kind, t, None) for name, n, o in zip(unit.hf, new, old)
                for kind, t in delta.encode(n.to(dtype).contiguous(), o.to(dtype).contiguous())]
    return [(b, [e[2] for e in es]) for b, es in cut([changed(u) for u in layout.units(spec)], bucket_bytes, delta=True)]


Entry = tuple  # (hf name, delta kind or "", tensor (a meta tensor: converted when sent), its rl.weights.shard_plan.Send)


def cut(units: list[list[Entry]], bucket_bytes: int, delta: bool, channel: int = 0) -> list[tuple[Bucket, list[Entry]]]:
    """Consecutive units' entries in buckets of about ``bucket_bytes`` (a unit is never split)."""
    out: list[tuple[Bucket, list[Entry]]] = []
    entries: list[Entry] = []
    size = 0

    def flush() -> None:
        nonlocal entries, size
        if entries:
            out.append((Bucket(tuple(e[0] for e in entries), tuple(dtype_name(e[2].dtype) for e in entries),
                               tuple(tuple(e[2].shape) for e in entries), size,
                               tuple(e[1] for e in entries) if delta else (), channel), entries))
        entries, size = [], 0

    for unit in units:
        if not unit:
            continue
        unit_bytes = sum(e[2].numel() * e[2].element_size() for e in unit)
        if entries and size + unit_bytes > bucket_bytes:
            flush()
        entries += unit
        size += unit_bytes
    flush()
    return out
