"""Token-aligned forwards of the actor and the critic over a :class:`TrainBatch`.

Alignment (the data contract's): column j of every ``[B, T]`` result belongs
to token j. ``logprobs[:, j]`` is log p(token j | tokens[:j]) and
``values[:, j]`` is the critic's value of the state in which token j was
sampled (its output at position j-1); column 0 has no predecessor and is 0
(it never carries loss). The forward runs over positions 0..T-2, the last
token is never fed, which matches SGLang's routing rows.

R3 (T1 report, section 05): with ``replay=True`` the actor's forward uses the
experts recorded by the sampler (``TrainBatch.routing_BTLK``, already through
the token pipeline, row count asserted per sample) via megatron-core's
``RouterReplay``; gates come from live scores, so the router still learns.
The critic never replays.
"""
from __future__ import annotations

import numpy as np
import torch

from rl import model as rmodel
from rl.errors import MissingRoutingError
from rl.routing import assert_row_count
from rl.trainer.batch import TrainBatch


def require_routing(batch: TrainBatch) -> None:
    """Refuse an R3 replay forward on a batch without routing rows (never route freely in silence)."""
    if batch.routing_BTLK is None:
        raise MissingRoutingError("the batch carries no routing rows but R3 replay is on; the sampler must "
                                  "return routed experts (--enable-return-routed-experts), or turn r3 off "
                                  "explicitly", num_samples=batch.num_samples)


def forward_rows(batch: TrainBatch) -> list[np.ndarray]:
    """Routing rows for the forward's positions 0..T-2, one ``[T-1, L, K]`` array per sample.

    Absent routing is a hard error (never a silent free-routing forward).
    """
    require_routing(batch)
    T = batch.tokens_BT.shape[1]
    rows = [batch.routing_BTLK[b, : T - 1].numpy() for b in range(batch.num_samples)]
    for b, rows_TLK in enumerate(rows):
        assert_row_count(T - 1, rows_TLK, sample=str(b), stage="actor forward")
    return rows


def shift_to_tokens(x_BT1: torch.Tensor) -> torch.Tensor:
    """[B, T-1] results for tokens 1..T-1 -> [B, T] with column 0 = 0."""
    return torch.nn.functional.pad(x_BT1, (1, 0))


def actor_logprobs(actor, batch: TrainBatch, *, replay: bool, temperature: float = 1.0,
                   with_entropy: bool = False):
    """fp32 ``[B, T]`` token-aligned log-probs at the sampling ``temperature``; differentiable
    when grad is enabled. ``with_entropy``: ``(logprobs, entropy)``, the entropy (no gradient)
    of the distribution each token was sampled from, aligned the same way."""
    ids_BT1, targets_BT1 = batch.tokens_BT[:, :-1], batch.tokens_BT[:, 1:]
    if not replay:
        out = rmodel.token_logprobs(actor, ids_BT1, targets_BT1, temperature, with_entropy=with_entropy)
    else:
        with rmodel.replay_routing(actor, forward_rows(batch)):
            out = rmodel.token_logprobs(actor, ids_BT1, targets_BT1, temperature, with_entropy=with_entropy)
    if with_entropy:
        return shift_to_tokens(out[0]), shift_to_tokens(out[1])
    return shift_to_tokens(out)


def critic_values(critic, batch: TrainBatch) -> torch.Tensor:
    """fp32 ``[B, T]`` token-aligned values (free routing: the critic never replays)."""
    return shift_to_tokens(rmodel.values(critic, batch.tokens_BT[:, :-1]))
