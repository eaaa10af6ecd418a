"""Token-count packing: trajectories to data-parallel ranks, then into micro-batches.

The report's token-level dynamic batching (section 09): a step's trajectories
are spread over the DP ranks by token count (longest first, each to the
least-loaded rank), and each rank's share is cut into micro-batches whose
padded size ``rows x positions`` stays under ``max_tokens_per_gpu``; a sample
longer than the cap is indivisible and goes alone (what preflight's
``max-tokens-per-gpu`` check says). Gradients accumulate over a rank's
micro-batches before one optimizer step.

Positions: a micro-batch of samples up to ``n`` tokens feeds ``n - 1``
positions (the last token is never fed), padded by the token pipeline to a
multiple of ``2 * sp`` (``rl.routing.shard_for_rank``), so the micro-batch
holds ``positions = padded + 1`` tokens per row.

Lockstep (``aligned=True``, needed when expert parallelism > 1): megatron's
``allgather`` dispatcher all-gathers equal-size token blocks over the
expert-parallel group, so every rank runs the same number of micro-batches
with the same shape; a rank with nothing left fills its rows with filler
rows (index -1: padding tokens, no loss, zero weight).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rl.errors import InputError
from rl.routing import pad_to_multiple

FILLER = -1


@dataclass(frozen=True)
class MicroBatch:
    rows: tuple[int, ...]  # sample indices of the full batch; FILLER for a filler row
    positions: int         # tokens per row, padding included

    @property
    def padded_tokens(self) -> int:
        return len(self.rows) * self.positions


def positions_for(num_tokens: int, sp_size: int) -> int:
    """Tokens per row for samples up to ``num_tokens``: fed positions padded by the token pipeline, + 1."""
    import numpy as np

    return pad_to_multiple(np.zeros(max(1, num_tokens - 1)), 2 * sp_size).shape[0] + 1


def pack_to_ranks(lengths: Sequence[int], dp: int) -> list[list[int]]:
    """Sample indices per DP rank: longest first onto the least-loaded rank (ties: lower rank)."""
    if dp < 1 or len(lengths) < dp:
        raise InputError(f"{len(lengths)} trajectories cannot fill {dp} data-parallel ranks; every rank needs at "
                         "least one (raise rollout.batch_size or lower trainer.parallel.dp)",
                         num_samples=len(lengths), dp=dp)
    loads, out = [0] * dp, [[] for _ in range(dp)]
    for i in sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i)):
        r = min(range(dp), key=lambda r: (loads[r], r))
        out[r].append(i)
        loads[r] += int(lengths[i])
    return [sorted(rows, key=lambda i: (-int(lengths[i]), i)) for rows in out]


def _cut(rows: list[int], lengths: Sequence[int], cap: int, sp: int) -> list[MicroBatch]:
    out, i = [], 0
    while i < len(rows):
        pos = positions_for(int(lengths[rows[i]]), sp)  # rows are longest first: the first sets the length
        take = max(1, min(len(rows) - i, cap // pos))
        out.append(MicroBatch(tuple(rows[i:i + take]), pos))
        i += take
    return out


def plan_micro_batches(per_rank: list[list[int]], lengths: Sequence[int], max_tokens_per_gpu: int,
                       sp_size: int = 1, aligned: bool = False) -> list[list[MicroBatch]]:
    """Micro-batches of every DP rank (see the module docstring for ``aligned``)."""
    if max_tokens_per_gpu < 1:
        raise InputError(f"max_tokens_per_gpu must be >= 1, got {max_tokens_per_gpu}")
    if not aligned:
        return [_cut(rows, lengths, max_tokens_per_gpu, sp_size) for rows in per_rank]
    cursors, plans = [0] * len(per_rank), [[] for _ in per_rank]
    while any(c < len(rows) for c, rows in zip(cursors, per_rank)):
        pos = max(positions_for(int(lengths[rows[c]]), sp_size)
                  for c, rows in zip(cursors, per_rank) if c < len(rows))
        take = max(1, max_tokens_per_gpu // pos)
        for r, rows in enumerate(per_rank):
            mine = rows[cursors[r]:cursors[r] + take]
            cursors[r] += len(mine)
            plans[r].append(MicroBatch(tuple(mine) + (FILLER,) * (take - len(mine)), pos))
    return plans


def mini_batch_rows(group_ids: Sequence, num: int) -> list[list[int]]:
    """Rows of each of ``num`` mini-batches: the prompt groups, in order of first appearance, split
    into ``num`` contiguous near-equal parts (a group's rows, chunks of one trajectory included,
    stay together). The walkthrough's ``train_batch_size`` groups in ``mini_batch_size`` steps."""
    groups = list(dict.fromkeys(group_ids))
    if num < 1 or len(groups) < num:
        raise InputError(f"trainer.mini_batches = {num} needs at least that many prompt groups; the batch has "
                         f"{len(groups)} (raise rollout.batch_size or lower trainer.mini_batches)",
                         num_groups=len(groups))
    parts = [set(groups[i * len(groups) // num:(i + 1) * len(groups) // num]) for i in range(num)]
    return [[r for r, g in enumerate(group_ids) if g in part] for part in parts]
