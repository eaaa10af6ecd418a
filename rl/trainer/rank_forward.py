"""One rank's micro-batch forwards and the data-parallel gathers of their results.

A :class:`~rl.trainer.packing.MicroBatch` names rows of the step's full
:class:`~rl.trainer.batch.TrainBatch` (every rank holds the whole batch: a
few integers per token). :func:`slice_rows` cuts any ``[B, T, ...]`` tensor to
the micro-batch's rows and positions (filler rows and positions past the
batch get ``fill``). The actor forward routes its R3 rows through exactly the
token pipeline of ``rl.routing`` (padding, then the sequence-parallel split
when SP is on) and asserts the per-sample row count against the tokens' own
shard on every rank before replaying them.

Results of a micro-batch are token-aligned ``[rows, positions]`` like
``rl.trainer.forward``; :func:`gather_samples` assembles per-sample results of
all data-parallel ranks into full ``[B, T]`` tensors, identical on every rank.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.distributed as dist

from rl import model as rmodel
from rl.model.context_parallel import cp_group
from rl.trainer import context
from rl.routing import assert_row_count, shard_for_rank
from rl.trainer.batch import PAD_TOKEN_ID, TrainBatch
from rl.trainer.forward import shift_to_tokens
from rl.trainer.packing import FILLER, MicroBatch
from rl.trainer.pipeline import stage_hidden, stage_routing_rows
from rl.trainer.rows import routing_rows, slice_rows  # noqa: F401  (rank_forward.slice_rows: callers' name)


def sp_rows(model, batch: TrainBatch, mb: MicroBatch, ids_bF: torch.Tensor, sp_size: int,
            sp_rank: int) -> list[np.ndarray]:
    """This rank's replay rows: each sample's forward rows of this stage's layers through the token
    pipeline, counts asserted."""
    rows_bFLK = stage_routing_rows(model, batch, mb, ids_bF.shape[1])
    out = []
    for i, row in enumerate(mb.rows):
        F = ids_bF.shape[1]
        tok_shard = shard_for_rank(ids_bF[i].numpy(), num_tokens=F, sp_size=sp_size, cp_size=1, cp_rank=0,
                                   sp_rank=sp_rank)
        rows_shard = shard_for_rank(rows_bFLK[i], num_tokens=F, sp_size=sp_size, cp_size=1, cp_rank=0,
                                    sp_rank=sp_rank)
        assert_row_count(tok_shard.shape[0], rows_shard, sample=str(row),
                         stage=f"sequence-parallel shard {sp_rank}/{sp_size}")
        out.append(rows_shard)
    return out


def _device(model) -> torch.device:
    return next(model.parameters()).device


def actor_logprobs(actor, batch: TrainBatch, mb: MicroBatch, *, replay: bool, sp_size: int = 1,
                   sp_rank: int = 0, temperature: float = 1.0, with_entropy: bool = False):
    """fp32 token-aligned ``[rows, positions]`` log-probs of the micro-batch (differentiable under grad);
    ``with_entropy``: ``(logprobs, entropy)``, the entropy without gradient, aligned the same way.

    The forward runs on the model's device; the result comes back to the CPU, where the batch lives.
    On a pipeline stage before the last the result is the stage's hidden states ``[s, b, h]`` (on the
    device, for the next stage: ``rl.trainer.pipeline``). Under context parallelism the forward is
    ``rl.trainer.context.actor_logprobs``'s (same result)."""
    if cp_group()[1] > 1:
        return context.actor_logprobs(actor, batch, mb, replay=replay, temperature=temperature,
                                      with_entropy=with_entropy, sp_size=sp_size, sp_rank=sp_rank)
    tokens = slice_rows(batch.tokens_BT, mb, fill=PAD_TOKEN_ID)
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    dev = _device(actor)
    replaying = rmodel.replay_routing(actor, sp_rows(actor, batch, mb, ids, sp_size, sp_rank), sp_size=sp_size) \
        if replay else contextlib.nullcontext()
    with replaying:
        if not actor.post_process:
            return stage_hidden(actor, ids.to(dev))
        out = rmodel.token_logprobs(actor, ids.to(dev), targets.to(dev), temperature, with_entropy=with_entropy)
    if with_entropy:
        return shift_to_tokens(out[0].cpu()), shift_to_tokens(out[1].cpu())
    return shift_to_tokens(out.cpu())


def critic_values(critic, batch: TrainBatch, mb: MicroBatch) -> torch.Tensor:
    """fp32 token-aligned ``[rows, positions]`` values (the critic routes freely); the hidden states on a
    pipeline stage before the last (the value head is on the last)."""
    if cp_group()[1] > 1:
        return context.critic_values(critic, batch, mb)
    tokens = slice_rows(batch.tokens_BT, mb, fill=PAD_TOKEN_ID)
    if not critic.post_process:
        return stage_hidden(critic, tokens[:, :-1].to(_device(critic)))
    return shift_to_tokens(rmodel.values(critic, tokens[:, :-1].to(_device(critic))).cpu())


def gather_samples(parts: dict[int, torch.Tensor], shape: tuple[int, int], group) -> torch.Tensor:
    """Full ``[B, T]`` from every DP rank's ``{sample: [n]}``; positions past a row's data are 0."""
    everyone: list = [None] * dist.get_world_size(group) if group is not None else [parts]
    if group is not None:
        dist.all_gather_object(everyone, {k: v.detach() for k, v in parts.items()}, group=group)
    out = torch.zeros(shape, dtype=torch.float32)
    for chunk in everyone:
        for row, values in chunk.items():
            width = min(shape[1], values.shape[0])
            out[row, :width] = values[:width]
    return out


def collect(mb: MicroBatch, result_bT: torch.Tensor, into: dict[int, torch.Tensor]) -> None:
    """Keep a micro-batch's per-sample results (filler rows dropped) for :func:`gather_samples`."""
    for i, row in enumerate(mb.rows):
        if row != FILLER:
            into[row] = result_bT[i].detach()
