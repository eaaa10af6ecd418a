"""Who sends which tensor: a weight sync fed by every rank's own shard (docs/weights.md, "Every rank sends").

No process gathers the model. Every rank reports what it holds (its placements, ``rl.trainer.shard``,
under the whole model's names); :func:`plan_sends` gives every megatron tensor of the policy one
*owner*, a rank that holds a piece of it, and the ranks its other pieces come from:

- a whole tensor (norms, router, experts on their expert-parallel rank, anything at tensor-parallel 1)
  is sent by one of its holders, straight from its shard;
- a tensor-parallel tensor (QKV, MLP, embedding and head rows) is assembled by its owner from one
  holder of each chunk, point to point, one tensor at a time, and sent whole: an engine with any
  tensor-parallel layout of its own receives whole Hugging Face tensors.

Owners are balanced by bytes (largest tensor first, to the least-loaded holder; ties to the lower
rank), so a data-parallel replica's copies split the sending between them. The plan is computed
identically on every rank from the same inputs; its order (by owner, then the policy's unit order)
is the order every rank walks (:func:`walk`) and the engines receive, so the point-to-point pieces
and the broadcasts cannot cross (each step's participants reach it in the same order).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import torch

from rl.errors import CheckpointError
from rl.trainer.shard import Placement


@dataclass(frozen=True)
class Held:
    """One tensor a rank holds: where it sits in the whole tensor, its local shape and dtype."""

    placement: Placement
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Send:
    """One megatron tensor of the policy: its owner sends it whole; ``pieces``: (rank, that rank's name)
    per chunk in chunk order (one entry: whole on the owner)."""

    mcore: str
    owner: int
    pieces: tuple[tuple[int, str], ...]
    placement: Placement
    shape: tuple[int, ...]     # the whole tensor's
    dtype: str


def _whole_shape(held: Held) -> tuple[int, ...]:
    shape = list(held.shape)
    if held.placement.dim is not None:
        shape[held.placement.dim] *= held.placement.count
    return tuple(shape)


def plan_sends(holdings: Sequence[Mapping[str, Held]], order: Sequence[str]) -> list[Send]:
    """``holdings[r]``: rank r's ``{name: Held}`` (names and ``full_name`` under the whole model's names);
    ``order``: the policy's megatron names in unit order. Every name is sent once; a name no rank holds,
    or a chunk no rank holds, is a :class:`CheckpointError` (a layout that lost part of the model)."""
    chunks: dict[str, dict[int, list[tuple[int, str, Held]]]] = {}
    for rank, held in enumerate(holdings):
        for name, h in held.items():
            chunks.setdefault(h.placement.full_name, {}).setdefault(h.placement.index, []).append((rank, name, h))
    missing = [n for n in order if n not in chunks]
    if missing:
        raise CheckpointError(f"no trainer rank holds {len(missing)} tensor(s) of the policy (first: {missing[:3]}); "
                              "the layout lost part of the model", missing=missing[:10])
    load = [0] * len(holdings)
    owned: dict[str, Send] = {}
    position = {n: i for i, n in enumerate(order)}
    size = {n: math.prod(_whole_shape(next(iter(chunks[n].values()))[0][2])) for n in order}
    for name in sorted(order, key=lambda n: (-size[n], position[n])):
        by_index = chunks[name]
        template = next(iter(by_index.values()))[0][2]
        count = template.placement.count if template.placement.dim is not None else 1
        if sorted(by_index) != list(range(count)):
            raise CheckpointError(f"{name}: chunks {sorted(by_index)} of {count} are held; a rank's shard is missing",
                                  path=name)
        holders = sorted({rank for held in by_index.values() for rank, _, _ in held})
        owner = min(holders, key=lambda r: (load[r], r))
        pieces = []
        for index in range(count):
            mine = [(r, n) for r, n, _ in by_index[index] if r == owner]
            pieces.append(mine[0] if mine else min(((r, n) for r, n, _ in by_index[index]),
                                                  key=lambda rn: (load[rn[0]], rn[0])))
        load[owner] += size[name]
        owned[name] = Send(name, owner, tuple(pieces), template.placement, _whole_shape(template), template.dtype)
    return sorted(owned.values(), key=lambda s: (s.owner, position[s.mcore]))


def plan_whole(state: Mapping[str, torch.Tensor], order: Sequence[str]) -> list[Send]:
    """The plan of a process that holds the whole policy (a world of 1, a test, a benchmark): it sends all."""
    held = {n: Held(Placement(n, None), tuple(t.shape), str(t.dtype).removeprefix("torch."))
            for n, t in state.items() if isinstance(t, torch.Tensor)}
    return plan_sends([held], order)


def owners(plan: Sequence[Send]) -> list[int]:
    """The ranks that send anything, in plan order (one weight-update group, one export file each)."""
    return sorted({s.owner for s in plan})


def walk(plan: Sequence[Send], rank: int, states: Sequence[Mapping[str, torch.Tensor]], *,
         send: Callable[[torch.Tensor, int], None], recv: Callable[[torch.Tensor, int], None],
         only: Callable[[Send], bool] = lambda s: True) -> Iterator[tuple[Send, list[torch.Tensor]]]:
    """Every rank runs this over the same plan: yields ``(send, [whole tensor per state])`` for the sends
    it owns, assembled from the pieces (its own from ``states``, the others received from their ranks),
    and sends its pieces of other owners' tensors when their turn comes. ``states``: one or more versions
    of this rank's shard (a delta needs the new one and its base), moved together in that order.
    ``only``: the sends this pass moves (the same predicate on every rank). Holds one tensor at a time."""
    for s in plan:
        if not only(s):
            continue
        if s.owner != rank:
            for r, n in s.pieces:
                if r == rank:
                    for state in states:
                        send(state[n].detach().contiguous(), s.owner)
            continue
        if len(s.pieces) == 1:
            yield s, [state[s.pieces[0][1]] for state in states]
            continue
        mine = next(n for r, n in s.pieces if r == rank)
        wholes = []
        for state in states:
            parts = []
            for r, n in s.pieces:
                if r == rank:
                    parts.append(state[n])
                else:
                    buf = torch.empty_like(state[mine])
                    recv(buf, r)
                    parts.append(buf)
            wholes.append(s.placement.join(parts))
        yield s, wholes
