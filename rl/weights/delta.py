"""Delta weight sync: only the Hugging Face tensors, or elements, that changed since the engines' version.

Between two RL steps at the report's learning rate (1e-6) most weights, cast to the dtype the
engines serve (bf16), do not change at all: an Adam step moves an fp32 master weight by ~1e-6, far
below a bf16 unit in the last place at a typical weight's magnitude (docs/weights.md, "Delta
sync"). So the trainer compares each Hugging Face tensor of the new version with the same tensor of
the *base* version (the one every engine of the group holds), both cast to the sent dtype and
compared by bit pattern, and sends per tensor the cheapest of:

- nothing (unchanged: not announced at all);
- ``index`` + ``value`` (sparse): the flat positions that changed (int32; int64 past 2**31
  elements) and the new values there, in the sent dtype;
- ``dense``: the whole tensor (when more than about a third of a bf16 tensor changed).

On the wire a delta is the ordinary ``/update_weights_from_distributed`` request with two t1ops
fields (``rl.engines.protocol_weights``): ``delta_base`` (the version the delta applies to) and
``delta_kinds`` (one kind per announced tensor). The engine refuses a delta whose base is not its
own version, by name (:func:`check_base`); it patches its current tensors, converts and loads them
all-or-nothing (:func:`apply`), and the per-tensor checksums that close every barrier prove the
result equals the trainer's full state (``rl.weights.checksums``).
"""
from __future__ import annotations

from typing import Sequence

import torch

from rl.errors import CheckpointError

DENSE, INDEX, VALUE = "dense", "index", "value"
KINDS = (DENSE, INDEX, VALUE)
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # a dtype's bit pattern, by width


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` flattened, as integers of the same width (equal bits <=> equal; NaN and -0.0 included)."""
    return t.reshape(-1).view(_BITS[t.element_size()])


def encode(new: torch.Tensor, old: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The wire entries that turn ``old`` into ``new`` (same shape and dtype): [] when equal."""
    if new.shape != old.shape or new.dtype != old.dtype:
        raise CheckpointError(f"delta between tensors of shape/dtype {tuple(new.shape)}/{new.dtype} and "
                              f"{tuple(old.shape)}/{old.dtype}: the base version has another ModelSpec")
    changed = (bits(new) != bits(old)).nonzero().squeeze(1)
    if changed.numel() == 0:
        return []
    index = changed.to(torch.int32 if new.numel() < 2**31 else torch.int64)
    if changed.numel() * (index.element_size() + new.element_size()) >= new.numel() * new.element_size():
        return [(DENSE, new.contiguous())]
    return [(INDEX, index), (VALUE, new.reshape(-1)[changed].contiguous())]


def check_base(base: str, current: str, where: str) -> None:
    """A delta applies to exactly one version: refuse it, by name, on any other."""
    if base != current:
        raise CheckpointError(f"{where}: a delta against base version {base!r} was refused: this engine holds "
                              f"version {current!r}; the trainer must resend the full weights", base=base,
                              current=current)


def apply(entries: Sequence[tuple[str, str, torch.Tensor]], current: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The new Hugging Face tensors of a delta: ``entries`` are (hf name, kind, wire tensor) in wire
    order; ``current[name]`` the engine's tensor now, in the wire dtype. A malformed delta (an index
    without its value, positions out of range, sizes that differ) raises naming the tensor."""
    out: dict[str, torch.Tensor] = {}
    i = 0
    while i < len(entries):
        name, kind, tensor = entries[i]
        if name not in current:
            raise CheckpointError(f"delta names {name!r}, which the served model does not have", path=name)
        base = current[name]
        if kind == DENSE:
            if tensor.shape != base.shape:
                raise CheckpointError(f"delta: dense {name} {tuple(tensor.shape)} != {tuple(base.shape)}", path=name)
            out[name] = tensor
            i += 1
            continue
        if kind != INDEX or i + 1 >= len(entries) or entries[i + 1][:2] != (name, VALUE):
            raise CheckpointError(f"delta: {name}: expected an index entry followed by its value entry, got "
                                  f"{kind!r} then {entries[i + 1][:2] if i + 1 < len(entries) else 'nothing'}",
                                  path=name)
        values = entries[i + 1][2]
        if tensor.dim() != 1 or values.shape != tensor.shape or values.dtype != base.dtype:
            raise CheckpointError(f"delta: {name}: {tensor.numel()} positions, values {tuple(values.shape)} "
                                  f"{values.dtype} (served {base.dtype})", path=name)
        if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= base.numel()):
            raise CheckpointError(f"delta: {name}: positions outside [0, {base.numel()})", path=name)
        patched = base.detach().clone().reshape(-1)
        patched[tensor.long()] = values
        out[name] = patched.reshape(base.shape)
        i += 2
    return out
