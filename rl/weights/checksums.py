"""Per-tensor checksums of a policy's weights, as the engines serve them (docs/weights.md).

The weight-sync barrier proves every engine loaded what the trainer sent: after a publish the
trainer names a checksum per tensor of the published state, cast to the dtype it sent
(:meth:`rl.weights.sender.WeightSender.weight_checksums`), and each engine computes the same
checksums from the tensors *in its model after the load* (the embedded engine's
``POST /weights_checksum``, :mod:`rl.engines.weight_updates`), never echoed from the request.
A reordered or corrupted chunk (SkyRL issue #1680: a multi-chunk update turned a MoE model's
output to gibberish with no error) changes at least one tensor's checksum.

Names are megatron's (the engine keeps megatron's layout; Hugging Face conversion only moves
data, so the cast tensors are bit-identical on both sides).
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # torch is imported where a tensor is hashed: the engine router compares digests
    import torch   # only (:func:`mismatched`) and its process stays without torch (docs/weights.md)

CHECKSUM_CHARS = 16  # 64 bits of sha256 per tensor: enough to tell a changed tensor, small to send


def tensor_checksum(tensor: torch.Tensor, dtype: torch.dtype) -> str:
    """sha256 (first :data:`CHECKSUM_CHARS` hex chars) of ``tensor`` cast to ``dtype``, as raw bytes."""
    import torch

    data = tensor.detach().to(device="cpu", dtype=dtype).contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy()).hexdigest()[:CHECKSUM_CHARS]


def state_checksums(state: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, str]:
    """``{name: tensor_checksum}`` of every tensor of ``state``."""
    import torch

    return {name: tensor_checksum(t, dtype) for name, t in state.items() if isinstance(t, torch.Tensor)}


def mismatched(expected: Mapping[str, str], loaded: Mapping[str, str]) -> list[str]:
    """Names whose loaded checksum differs from (or lacks) the expected one, in ``expected``'s order."""
    return [name for name, digest in expected.items() if loaded.get(name) != digest]
