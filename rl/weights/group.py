"""A torch.distributed group for weight updates, beside the process's default group.

SGLang's ``/init_weights_update_group`` (``InitWeightsUpdateGroupReqInput``: master_address,
master_port, rank_offset, world_size, group_name, backend) makes its side of the group with
``init_custom_process_group``: a ``tcp://`` rendezvous whose rank 0 (the trainer) hosts the
TCP store, a ``PrefixStore(group_name, ...)``, and ``_new_process_group_helper``, so the group
exists beside the default group both processes already have (megatron's world here). Both
sides here make it the same way (the mechanism, not SGLang's code), so the trainer meets a
real SGLang server and the embedded engine alike. ``_new_process_group_helper`` is private
torch API; every RL framework that talks to SGLang/vLLM this way relies on it, and
``tests/rl/test_weight_group.py`` breaks if a torch upgrade changes it.

Transfer contract (``UpdateWeightsFromDistributedReqInput``: names, dtypes, shapes): one
``broadcast(src=0)`` per tensor, in the order of ``names``; receivers allocate
``torch.empty(shape, dtype=getattr(torch, dtype))``.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Iterable, Sequence

import torch
import torch.distributed as dist

from rl.errors import InputError


def init_update_group(*, backend: str, master_address: str, master_port: int, rank: int, world_size: int,
                      group_name: str, timeout_s: float = 600.0):
    """Join (rank > 0) or host (rank 0) the group; returns once all ``world_size`` ranks joined.

    Every process needs a default process group first (megatron's world of 1 here, SGLang's
    own world on a server): ``_new_process_group_helper`` registers the new group beside it.
    """
    from torch.distributed.distributed_c10d import PrefixStore, _new_process_group_helper, _world, rendezvous

    if not dist.is_initialized():
        raise InputError("init_update_group needs a default process group (rl.megatron_cpu.init_single_process)")
    if not group_name:
        raise InputError("group_name must not be empty (SGLang refuses an empty name)")
    if not 0 <= rank < world_size:
        raise InputError(f"rank {rank} outside [0, {world_size})", rank=rank, world_size=world_size)
    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size,
                                              timeout=timeout))
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(world_size, rank, [], dist.Backend(backend), PrefixStore(group_name, store),
                                         group_name=group_name, timeout=timeout)
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}  # group rank i = "global" rank i
    return group


def destroy_update_group(group) -> None:
    """Leave the group (a peer that died leaves nothing to wait for)."""
    dist.destroy_process_group(group)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the string SGLang's receiver passes to ``getattr(torch, ...)``)."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"dtype {name!r} is not a torch dtype name (e.g. 'bfloat16', 'float32')", dtype=name)
    return dtype


def send_tensors(tensors: Iterable[torch.Tensor], group) -> int:
    """Rank 0: broadcast each tensor in order; returns the bytes sent."""
    sent = 0
    for tensor in tensors:
        dist.broadcast(tensor.contiguous(), src=0, group=group)
        sent += tensor.numel() * tensor.element_size()
    return sent


def receive_tensors(names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], group,
                    device: str = "cpu") -> dict[str, torch.Tensor]:
    """Rank > 0: receive one broadcast per name, as SGLang's receiver does."""
    return dict(zip(names, receive_list(names, dtypes, shapes, group, device)))


def receive_list(names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], group,
                 device: str = "cpu") -> list[torch.Tensor]:
    """Rank > 0: one broadcast per announced tensor, in order (a delta names a tensor twice)."""
    if not len(names) == len(dtypes) == len(shapes):
        raise InputError(f"names ({len(names)}), dtypes ({len(dtypes)}) and shapes ({len(shapes)}) differ in length")
    out: list[torch.Tensor] = []
    for dtype, shape in zip(dtypes, shapes):
        tensor = torch.empty(list(shape), dtype=parse_dtype(dtype), device=device)
        dist.broadcast(tensor, src=0, group=group)
        out.append(tensor)
    return out
