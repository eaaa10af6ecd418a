"""Routing record and replay (R3) on the policy's routers: which experts each token chose.

Row convention: position t's routing row is what the layer chose for the token at t when it
was fed as input; a trajectory of N tokens has N-1 rows (the last token is never fed),
matching SGLang's ``routed_experts``.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import numpy as np
import torch

from rl.errors import RoutingError
from rl.model.spec import ModelSpec

# The failure ids of docs/failures.md this guard catches (`t1ops explain ID`): one router per layer,
# taken from the model given, never from megatron's process-wide registry.
CATCHES = {
    "routing-replay-noop": ("trainer.r3",),
}


def router_replays(model) -> list:
    replays = [m.router_replay for m in model.modules() if getattr(m, "router_replay", None) is not None]
    expected = _num_layers(model)
    if len(replays) != expected:
        raise RoutingError(
            f"model has {len(replays)} routers with replay, expected {expected}; "
            "build it with build_policy()",
            num_routers=len(replays),
        )
    return replays


def _num_layers(model) -> int:
    """Layers this model holds: all of them, or a pipeline stage's (``t1_layers``, rl.trainer.pipeline)."""
    return getattr(model, "t1_layers", (0, model.t1_spec.num_layers))[1]


class RoutingRecord:
    """Filled when ``record_routing`` exits: ``rows`` = B arrays int32 [T, L, K]."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.batch_size = 0


@contextlib.contextmanager
def record_routing(model) -> Iterator[RoutingRecord]:
    """Record the top-k experts chosen in the LAST forward inside the block.

    mcore routes flattened [T * B] tokens in sequence-major order, so token
    (b, t) is row t * B + b of each layer's record.
    """
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    replays = router_replays(model)
    record = RoutingRecord()

    def grab_batch(_module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        record.batch_size = int(ids.shape[0])

    hook = model.register_forward_pre_hook(grab_batch, with_kwargs=True)
    for replay in replays:
        replay.clear_indices()
        replay.set_router_replay_action(RouterReplayAction.RECORD)
    try:
        yield record
        per_layer = [replay.get_recorded_indices() for replay in replays]
        if any(indices is None for indices in per_layer):
            raise RoutingError("record_routing saw no forward pass; run the model inside the block")
        topk_LNK = torch.stack([indices.detach().to("cpu") for indices in per_layer])
        num_layers, num_tokens, topk = topk_LNK.shape
        rows_TBLK = topk_LNK.view(num_layers, num_tokens // record.batch_size, record.batch_size, topk).permute(1, 2, 0, 3)
        record.rows = [rows_TBLK[:, b].numpy().astype(np.int32) for b in range(record.batch_size)]
    finally:
        hook.remove()
        for replay in replays:
            replay.clear_router_replay_action()
            replay.clear_indices()


def _check_rows(rows: Sequence[np.ndarray], spec: ModelSpec, num_layers: int) -> list[np.ndarray]:
    checked = []
    for b, rows_TLK in enumerate(rows):
        rows_TLK = np.asarray(rows_TLK)
        if rows_TLK.ndim != 3 or rows_TLK.shape[1:] != (num_layers, spec.moe_router_topk):
            raise RoutingError(
                f"rows[{b}] has shape {rows_TLK.shape}, expected [T, {num_layers}, {spec.moe_router_topk}]",
                sample=b, shape=rows_TLK.shape,
            )
        if rows_TLK.size and (rows_TLK.min() < 0 or rows_TLK.max() >= spec.num_experts):
            raise RoutingError(f"rows[{b}] holds expert ids outside [0, {spec.num_experts})", sample=b)
        sorted_TLK = np.sort(rows_TLK, axis=-1)
        if rows_TLK.size and (np.diff(sorted_TLK, axis=-1) == 0).any():
            raise RoutingError(f"rows[{b}] selects the same expert twice for one token", sample=b)
        checked.append(rows_TLK.astype(np.int64))
    return checked


@contextlib.contextmanager
def replay_routing(model, rows: Sequence[np.ndarray], sp_size: int = 1) -> Iterator[None]:
    """Forwards inside the block use the experts in ``rows`` (R3).

    ``rows[b]`` is int [T_b, L, K] for sample b; every forward inside the
    block must have batch size len(rows) and T >= max T_b. Positions t >= T_b
    (padding) get experts 0..K-1. Gate weights come from the live router
    scores at the replayed experts, so router weights still get gradients.

    Under sequence parallelism (``sp_size`` > 1) the routers of this rank see
    only its slice of the positions: ``rows`` are then this rank's slice (the
    token pipeline's SP split, ``rl.routing.shard_for_rank``) and T counts the
    local positions, ``num_positions / sp_size``.
    """
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    spec: ModelSpec = model.t1_spec
    replays = router_replays(model)
    checked = _check_rows(rows, spec, len(replays))

    def set_targets(_module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        batch_size, num_positions = int(ids.shape[0]), int(ids.shape[1])
        if num_positions % sp_size:
            raise RoutingError(f"{num_positions} positions do not split over sp_size = {sp_size}; pad them "
                               "through the token pipeline first")
        num_positions //= sp_size
        if batch_size != len(checked):
            raise RoutingError(f"replay has rows for {len(checked)} samples, forward has {batch_size}")
        targets_TBLK = np.broadcast_to(
            np.arange(spec.moe_router_topk), (num_positions, batch_size, len(replays), spec.moe_router_topk)
        ).copy()
        for b, rows_TLK in enumerate(checked):
            if rows_TLK.shape[0] > num_positions:
                raise RoutingError(
                    f"rows[{b}] has {rows_TLK.shape[0]} positions, forward has only {num_positions}", sample=b
                )
            targets_TBLK[: rows_TLK.shape[0], b] = rows_TLK
        targets = torch.from_numpy(targets_TBLK).to(ids.device)
        for layer, replay in enumerate(replays):
            replay.clear_indices()
            replay.set_target_indices(targets[:, :, layer].reshape(num_positions * batch_size, -1))

    hook = model.register_forward_pre_hook(set_targets, with_kwargs=True)
    for replay in replays:
        replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    try:
        yield
    finally:
        hook.remove()
        for replay in replays:
            replay.clear_router_replay_action()
            replay.clear_indices()

