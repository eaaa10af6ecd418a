"""A context-parallel rank's share of a micro-batch: one zig-zag slice for every per-position array.

docs/parallelism.md, "Context parallelism". Tokens, targets, loss weights, the other per-token
training arrays and the R3 routing rows all go through :func:`zigzag_BT`, which applies
:func:`rl.routing.shard_for_rank` (pad, zig-zag chunks ``r`` and ``2cp-1-r``) to each row: the one
token pipeline of the report's R3 contract. The model's positions are the same slice of
``arange`` (:func:`rl.model.context_parallel.zigzag_positions`). :func:`routing_slice` carries each
row's source position through the slice with the row and asserts, per sample, that the rank replays
exactly one row per local token and that each row is the row of that token.
"""
from __future__ import annotations

import numpy as np
import torch

from rl.errors import InputError, RoutingError
from rl.model.context_parallel import padded_length, zigzag_positions
from rl.routing import assert_row_count, shard_for_rank


def zigzag_BT(x_BT, cp_size: int, cp_rank: int, *, num_positions: int, fill=0):
    """``[B, T, ...]`` (tensor or array) -> this rank's ``[B, num_positions / cp, ...]``: each row padded
    with ``fill`` to ``num_positions`` and zig-zag sliced by ``rl.routing.shard_for_rank``."""
    if cp_size == 1:
        return x_BT
    is_tensor = isinstance(x_BT, torch.Tensor)
    arr = x_BT.numpy() if is_tensor else np.asarray(x_BT)
    if num_positions % (2 * cp_size) or num_positions < arr.shape[1]:
        raise InputError(f"{num_positions} positions cannot hold {arr.shape[1]} in 2 x cp = {2 * cp_size} equal chunks; "
                         "use rl.model.context_parallel.padded_length")
    out = []
    for row in arr:
        padded = np.full((num_positions,) + row.shape[1:], fill, dtype=row.dtype)
        padded[: row.shape[0]] = row
        out.append(shard_for_rank(padded, num_tokens=num_positions, sp_size=1, cp_size=cp_size, cp_rank=cp_rank,
                                  sp_rank=0, pad_value=fill))
    local = np.stack(out)
    return torch.from_numpy(local) if is_tensor else local


def routing_slice(rows_bFLK: np.ndarray, num_local: int, cp_size: int, cp_rank: int,
                  samples: list) -> list[np.ndarray]:
    """This rank's R3 rows ``[num_local, L, K]`` of each sample: the tokens' slice, asserted per sample.

    Each row travels with its source position; a row count other than ``num_local`` or a row of
    another position than the rank's token there raises RoutingError naming the sample."""
    b, F, L, K = rows_bFLK.shape
    tagged = np.concatenate([rows_bFLK.reshape(b, F, L * K).astype(np.int64),
                             np.broadcast_to(np.arange(F)[None, :, None], (b, F, 1))], axis=-1)
    local = zigzag_BT(tagged, cp_size, cp_rank, num_positions=num_local * cp_size, fill=-1)
    want = zigzag_positions(num_local, cp_size, cp_rank).numpy()
    want = np.where(want < F, want, -1)  # padding positions carry no row of the sample
    stage = f"context-parallel zig-zag {cp_rank}/{cp_size}"
    out = []
    for i, sample in enumerate(samples):
        assert_row_count(num_local, local[i], sample=str(sample), stage=stage)
        got = local[i][:, -1]
        if not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            raise RoutingError(f"sample {sample} at {stage}: local position {bad} replays the row of position "
                               f"{int(got[bad])}, its token is position {int(want[bad])}; rows and tokens went "
                               "through different transforms", sample=str(sample), stage=stage)
        rows = local[i][:, :-1].reshape(num_local, L, K)
        rows = np.where(rows < 0, np.arange(K), rows)  # padding: experts 0..K-1, as rank_forward.routing_rows
        out.append(rows.astype(np.int32))
    return out


# --- a micro-batch's forward on a CP rank (rl.trainer.rank_forward delegates here) ------------------
class _GatherPositions(torch.autograd.Function):
    """``[b, n]`` per rank -> ``[b, n * cp]`` in sequence order on every CP rank. Every CP rank computes
    the same loss from the gathered tensor, so backward keeps this rank's positions of the gradient
    (summing the ranks' parameter gradients, ``rl.trainer.grads``, gives the whole gradient)."""

    @staticmethod
    def forward(ctx, local_bS, group, size, rank):
        parts = [torch.empty_like(local_bS) for _ in range(size)]
        torch.distributed.all_gather(parts, local_bS.contiguous(), group=group)
        ctx.pos = zigzag_positions(local_bS.shape[1], size, rank)
        return torch.from_numpy(np.stack([_unzigzag_row([p[b].numpy() for p in parts])
                                          for b in range(local_bS.shape[0])]))

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.pos].contiguous(), None, None, None


def _unzigzag_row(parts: list[np.ndarray]) -> np.ndarray:
    from rl.routing import cp_zigzag_unslice

    return cp_zigzag_unslice(parts)


def _local_inputs(batch, mb, cp_size: int, cp_rank: int):
    from rl.trainer.batch import PAD_TOKEN_ID
    from rl.trainer.rows import slice_rows

    tokens = slice_rows(batch.tokens_BT, mb, fill=PAD_TOKEN_ID)
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    total = padded_length(ids.shape[1], cp_size)
    local = [zigzag_BT(x, cp_size, cp_rank, num_positions=total, fill=PAD_TOKEN_ID) for x in (ids, targets)]
    return ids.shape[1], total, local[0], local[1]


def sp_split_rows(rows: list[np.ndarray], sp_size: int, sp_rank: int, samples: list) -> list[np.ndarray]:
    """Under sequence parallelism, each CP-local sample's rows split as its tokens are (the token
    pipeline's CP-then-SP order, ``rl.routing.shard_for_rank``), counts asserted per sample."""
    if sp_size == 1:
        return rows
    out = []
    for sample, r in zip(samples, rows):
        n = r.shape[0]
        tokens = np.arange(n)  # the CP-local positions, split as the embedding scatters them
        tok = shard_for_rank(tokens, num_tokens=n, sp_size=sp_size, cp_size=1, cp_rank=0, sp_rank=sp_rank)
        mine = shard_for_rank(r, num_tokens=n, sp_size=sp_size, cp_size=1, cp_rank=0, sp_rank=sp_rank)
        assert_row_count(tok.shape[0], mine, sample=str(sample), stage=f"sequence-parallel shard {sp_rank}/{sp_size}")
        out.append(mine)
    return out


def actor_logprobs(actor, batch, mb, *, replay: bool, temperature: float, with_entropy: bool,
                   sp_size: int = 1, sp_rank: int = 0):
    """``rl.trainer.rank_forward.actor_logprobs`` on a CP rank: this rank's zig-zag tokens and R3 rows
    through the model (then the sequence-parallel split of both when SP is on), the per-token results
    gathered whole over the CP group."""
    import contextlib

    from rl import model as rmodel
    from rl.model.context_parallel import cp_group
    from rl.trainer.forward import shift_to_tokens
    from rl.trainer.pipeline import stage_hidden, stage_routing_rows

    group, size, rank = cp_group()
    F, total, ids, targets = _local_inputs(batch, mb, size, rank)
    replaying = contextlib.nullcontext()
    if replay:
        rows = stage_routing_rows(actor, batch, mb, F)
        local = routing_slice(rows, total // size, size, rank, list(mb.rows))
        replaying = rmodel.replay_routing(actor, sp_split_rows(local, sp_size, sp_rank, list(mb.rows)),
                                          sp_size=sp_size)
    with replaying:
        if not actor.post_process:  # a pipeline stage before the last: its local hidden states
            return stage_hidden(actor, ids)
        out = rmodel.token_logprobs(actor, ids, targets, temperature, with_entropy=with_entropy)
    outs = out if with_entropy else (out,)
    full = [shift_to_tokens(_GatherPositions.apply(o, group, size, rank)[:, :F]) for o in outs]
    return tuple(full) if with_entropy else full[0]


def critic_values(critic, batch, mb) -> torch.Tensor:
    """``rl.trainer.rank_forward.critic_values`` on a CP rank (the critic routes freely)."""
    from rl import model as rmodel
    from rl.model.context_parallel import cp_group
    from rl.trainer.forward import shift_to_tokens

    group, size, rank = cp_group()
    F, _, ids, _ = _local_inputs(batch, mb, size, rank)
    if not critic.post_process:
        from rl.trainer.pipeline import stage_hidden

        return stage_hidden(critic, ids)
    return shift_to_tokens(_GatherPositions.apply(rmodel.values(critic, ids), group, size, rank)[:, :F])
