"""Activation bytes a step holds for backward: the measurement behind the memory model's per-token term.

:class:`SavedActivations` counts, through ``torch.autograd.graph.saved_tensors_hooks``, the distinct
non-parameter storages autograd saves for backward, and keeps the peak of what is alive at once: a
saved tensor stops counting when autograd releases it (after its backward, or when its graph is
dropped). One forward then its backward peaks at the sum of what the forward saved; a 1F1B pipeline
stage peaks with several micro-batches in flight. CPU ranks have no allocator statistics, so this
is the activation memory we can measure there (docs/preflight.md, "Calibration on CPU ranks").
"""
from __future__ import annotations

from collections.abc import Iterable

import torch


class _Held:
    """A saved tensor and the tracker that counts it until autograd drops it."""

    __slots__ = ("tensor", "tracker", "ptr")

    def __init__(self, tensor: torch.Tensor, tracker: "SavedActivations", ptr: int) -> None:
        self.tensor, self.tracker, self.ptr = tensor, tracker, ptr

    def __del__(self) -> None:
        self.tracker._release(self.ptr)


class SavedActivations:
    """``with SavedActivations(models) as s: ...``; then ``s.peak_bytes`` (and ``s.live_bytes``)."""

    def __init__(self, models: Iterable[torch.nn.Module | None]) -> None:
        self._params = {p.untyped_storage().data_ptr() for m in models if m is not None for p in m.parameters()}
        self._refs: dict[int, list[int]] = {}  # storage pointer -> [saved references alive, bytes]
        self.live_bytes = 0
        self.peak_bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._params or ptr == 0:
            return t
        ref = self._refs.setdefault(ptr, [0, 0])
        ref[0] += 1
        if storage.nbytes() > ref[1]:
            self.live_bytes += storage.nbytes() - ref[1]
            ref[1] = storage.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return _Held(t, self, ptr)

    @staticmethod
    def _unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def _release(self, ptr: int) -> None:
        ref = self._refs[ptr]
        ref[0] -= 1
        if ref[0] == 0:
            self.live_bytes -= ref[1]
            del self._refs[ptr]

    def __enter__(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
