"""R3 measurements: the train-vs-rollout log-prob gap with replay off and on.

T1 report, section 05: sampler and trainer are different numerical
implementations, so router scores differ slightly and top-k flips whenever
the margin between rank k and k+1 is that small; R3 (with TITO) took the
gap from 0.021 to 0.013. :func:`measure_routing_gap` reproduces that
comparison on one batch: same weights, same tokens, free routing vs replayed
routing, and checks that the replayed forward used exactly the recorded
experts (read back from the routers' own routing maps).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from rl import model as rmodel
from rl.metrics import logprob_gap
from rl.trainer.batch import TrainBatch
from rl.trainer.forward import actor_logprobs, forward_rows

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "routing-drift": ("trainer.r3",),
}


@dataclass
class RoutingGap:
    """Gap numbers for one batch (``logprob_gap``: mean |train - rollout| over loss tokens)."""

    gap_r3_off: float
    gap_r3_on: float
    num_tokens: int               # loss-bearing tokens measured
    num_rows: int                 # (token, layer) routing rows compared
    num_flipped_rows: int         # rows where the trainer's free top-k differs from the sampler's
    replay_used_recorded: bool    # the replayed forward selected exactly the recorded experts

    @property
    def flipped_fraction(self) -> float:
        return self.num_flipped_rows / self.num_rows if self.num_rows else 0.0


@contextlib.contextmanager
def _captured_routing_maps(actor) -> Iterator[list[torch.Tensor]]:
    """The routers' ``routing_map`` outputs ([T*B, E] bool per layer) of the forward in the block."""
    maps: list[torch.Tensor] = []
    routers = [m for m in actor.modules() if getattr(m, "router_replay", None) is not None]
    hooks = [r.register_forward_hook(lambda _m, _a, out: maps.append(out[1].detach().clone())) for r in routers]
    try:
        yield maps
    finally:
        for h in hooks:
            h.remove()


def _real_positions(batch: TrainBatch) -> list[int]:
    """Per sample, the forward positions fed a real token (0..n-2)."""
    return [int(n) - 1 for n in batch.num_tokens_B]


def _maps_match_rows(maps: list[torch.Tensor], rows: list[np.ndarray], lengths: list[int]) -> bool:
    B = len(rows)
    for layer, map_NE in enumerate(maps):
        for b, rows_TLK in enumerate(rows):
            for t in range(lengths[b]):
                chosen = torch.nonzero(map_NE[t * B + b]).flatten().tolist()
                if chosen != sorted(rows_TLK[t, layer].tolist()):
                    return False
    return True


def _count_flips(free_rows: list[np.ndarray], rows: list[np.ndarray], lengths: list[int]) -> tuple[int, int]:
    total = flipped = 0
    for free_TLK, rec_TLK, n in zip(free_rows, rows, lengths):
        a, b = np.sort(free_TLK[:n], axis=-1), np.sort(rec_TLK[:n], axis=-1)
        same_TL = (a == b).all(axis=-1)
        total += same_TL.size
        flipped += int((~same_TL).sum())
    return total, flipped


@torch.no_grad()
def measure_routing_gap(actor, batch: TrainBatch) -> RoutingGap:
    """Log-prob gap against ``batch.rollout_logprobs_BT`` with free routing and with R3 replay."""
    actor.eval()
    mask_BT = batch.loss_mask_BT
    rows, lengths = forward_rows(batch), _real_positions(batch)
    with rmodel.record_routing(actor) as free:
        free_lp_BT = actor_logprobs(actor, batch, replay=False)
    with _captured_routing_maps(actor) as maps:
        replay_lp_BT = actor_logprobs(actor, batch, replay=True)
    num_rows, num_flipped = _count_flips(free.rows, rows, lengths)
    return RoutingGap(gap_r3_off=float(logprob_gap(free_lp_BT, batch.rollout_logprobs_BT, mask_BT)),
                      gap_r3_on=float(logprob_gap(replay_lp_BT, batch.rollout_logprobs_BT, mask_BT)),
                      num_tokens=batch.num_loss_tokens, num_rows=num_rows, num_flipped_rows=num_flipped,
                      replay_used_recorded=len(maps) == actor.t1_spec.num_layers
                      and _maps_match_rows(maps, rows, lengths))
