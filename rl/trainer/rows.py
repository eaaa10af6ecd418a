"""One micro-batch's rows of a ``[B, T, ...]`` batch tensor and of its routing (``rl.trainer.packing.MicroBatch``)."""
from __future__ import annotations

import torch

from rl.trainer.batch import TrainBatch
from rl.trainer.forward import require_routing
from rl.trainer.packing import FILLER, MicroBatch


def slice_rows(x: torch.Tensor, mb: MicroBatch, fill=0) -> torch.Tensor:
    """``x[rows, :positions]`` with filler rows / positions beyond ``x`` set to ``fill``."""
    out = torch.full((len(mb.rows), mb.positions) + tuple(x.shape[2:]), fill, dtype=x.dtype)
    width = min(mb.positions, x.shape[1])
    for i, row in enumerate(mb.rows):
        if row != FILLER:
            out[i, :width] = x[row, :width]
    return out


def routing_rows(batch: TrainBatch, mb: MicroBatch) -> torch.Tensor:
    """``[rows, positions, L, K]`` routing; padding positions and filler rows get experts 0..K-1."""
    require_routing(batch)
    K = batch.routing_BTLK.shape[-1]
    pad = torch.arange(K, dtype=batch.routing_BTLK.dtype)
    out = pad.expand(len(mb.rows), mb.positions, batch.routing_BTLK.shape[2], K).clone()
    width = min(mb.positions, batch.routing_BTLK.shape[1])
    for i, row in enumerate(mb.rows):
        if row != FILLER:
            n = int(batch.num_tokens_B[row])
            out[i, :min(n, width)] = batch.routing_BTLK[row, :min(n, width)]
    return out
