"""Pipeline parallelism on CPU ranks: a stage's weights and R3 rows, and a 1F1B schedule.

docs/parallelism.md, "Pipeline parallelism". With ``pp`` stages, stage ``s`` builds layers
``[s L/pp, (s+1) L/pp)`` (``rl.model_parallel.stage_layers``); the first stage holds the embedding, the
last the final norm and the head (the LM head, or the critic's value head), so the loss, its
reduction weights and the values live on the last stage. megatron-core's own schedules
(``pipeline_parallel/schedules.py``) allocate on CUDA and synchronise it: they stay the GPU path, and
:func:`one_f_one_b` is the same 1F1B order written for gloo (blocking receives, asynchronous sends, so
the schedule cannot deadlock): ``pp - s - 1`` warm-up forwards, then one forward and one backward per
step, then the cool-down backwards. The micro-batches are the existing packer's
(``rl.trainer.packing``).

R3 on a stage: the routers of a stage are the routers of its layers, so a stage replays the layer
columns ``[first, first + count)`` of each sample's rows; :func:`stage_rows` asserts, per sample, one
row per token and exactly the stage's layer count (``rl.trainer.rank_forward`` calls it on every
forward that replays, with one stage too).

The rank trainer (``rl.trainer.ranks``) runs every micro-batch loop through :func:`run_forwards` /
:func:`run_updates`; with one stage they are forward (+ loss, backward) per micro-batch. What the
last stage computes (per-sample results, loss tallies) reaches the other stages by
:func:`from_last_stage`; weights leave a rank under the whole model's names (:func:`global_shard`)
and enter it by :func:`stage_state`.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from rl.errors import RoutingError
from rl.routing import assert_row_count

_TAG_FWD, _TAG_BWD = 21, 22


def _ps():
    from megatron.core import parallel_state

    return parallel_state


def stage_info() -> tuple[int, int]:
    """(stage, number of stages) of this rank."""
    ps = _ps()
    if not ps.model_parallel_is_initialized():
        return 0, 1
    return ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size()


# --- weights ----------------------------------------------------------------------------------
def _layer_of(name: str) -> int | None:
    if name.startswith("decoder.layers."):
        return int(name.split(".")[2])
    return None


def stage_state(full: Mapping[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """The tensors of ``full`` (a whole model's state) that this stage holds, under its local names
    (megatron numbers a stage's layers from 0)."""
    first, count = model.t1_layers
    out = {}
    for name, tensor in full.items():
        layer = _layer_of(name)
        if layer is not None:
            if first <= layer < first + count:
                parts = name.split(".")
                parts[2] = str(layer - first)
                out[".".join(parts)] = tensor
        elif name.startswith("embedding."):
            if model.pre_process:
                out[name] = tensor
        elif model.post_process:  # final norm, head
            out[name] = tensor
    return out


def global_name(name: str, first: int) -> str:
    """A stage's tensor name under the whole model's name (its layer ``i`` is layer ``first + i``)."""
    layer = _layer_of(name)
    if layer is None:
        return name
    parts = name.split(".")
    parts[2] = str(layer + first)
    return ".".join(parts)


def global_names(state: Mapping[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """Inverse of :func:`stage_state`: a stage's tensors under the whole model's names."""
    first = model.t1_layers[0]
    return {global_name(name, first): tensor for name, tensor in state.items()}


def global_shard(where: Mapping, state: Mapping[str, torch.Tensor], model) -> tuple[dict, dict[str, torch.Tensor]]:
    """A rank's (placements, tensors) (``rl.trainer.shard``) under the whole model's names, so the shards of
    every stage assemble into one full state (``rl.trainer.shard.assemble``)."""
    first = model.t1_layers[0]
    if first == 0:
        return dict(where), dict(state)
    named = {global_name(n, first): dataclasses.replace(p, full_name=global_name(p.full_name, first))
             for n, p in where.items()}
    return named, global_names(state, model)


# --- R3 on a stage ----------------------------------------------------------------------------
def stage_rows(rows: Sequence[np.ndarray], num_positions: int, model, samples: Sequence) -> list[np.ndarray]:
    """Each sample's rows ``[T, L, K]`` cut to this stage's layers; counts asserted per sample per stage."""
    first, count = model.t1_layers
    stage = stage_info()
    where = f"pipeline stage {stage[0]}/{stage[1]} (layers {first}..{first + count - 1})"
    out = []
    for sample, rows_TLK in zip(samples, rows):
        assert_row_count(num_positions, rows_TLK, sample=str(sample), stage=where)
        if rows_TLK.shape[1] != model.t1_spec.num_layers:
            raise RoutingError(f"sample {sample} at {where}: rows hold {rows_TLK.shape[1]} layers, the model "
                               f"{model.t1_spec.num_layers}", sample=str(sample), stage=where)
        local = rows_TLK[:, first:first + count]
        if local.shape[1] != count:
            raise RoutingError(f"sample {sample} at {where}: {local.shape[1]} layer columns for {count} layers",
                               sample=str(sample), stage=where)
        out.append(local)
    return out


# --- the schedule ---------------------------------------------------------------------------------
def _device(model) -> torch.device:
    return next(model.parameters()).device


def _no_watch(_phase: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _peer(offset: int) -> int:
    ps = _ps()
    ranks = dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())
    return ranks[ps.get_pipeline_model_parallel_rank() + offset]


def one_f_one_b(model, num_micro_batches: int, forward: Callable[[int], torch.Tensor],
                input_shape: Callable[[int], tuple], loss: Callable[[int, torch.Tensor], torch.Tensor],
                *, dtype: torch.dtype = torch.float32, on_backward: Callable[[int], None] | None = None,
                watch: Callable[[str], contextlib.AbstractContextManager] | None = None) -> None:
    """Forward and backward ``num_micro_batches`` micro-batches through this stage in 1F1B order.

    ``forward(i)`` runs the stage's model on micro-batch ``i`` (after ``model.set_input_tensor``, which
    this function calls with the received activation on every stage but the first) and returns its
    output: hidden states ``[s, b, h]`` on a stage before the last, anything on the last, where
    ``loss(i, output)`` gives the scalar to backpropagate. ``input_shape(i)``: the activation's shape
    arriving at this stage. Gradients accumulate in the parameters, as the micro-batch loop's do.
    With one stage this is forward, loss, backward per micro-batch: the rank trainer's one path
    (``rl.trainer.ranks``). ``watch(phase)`` wraps each receive and backward (the progress watchdog)."""
    watch = watch or _no_watch
    stage, stages = stage_info()
    first, last = stage == 0, stage == stages - 1
    warmup = min(stages - stage - 1, num_micro_batches)
    pending_sends: list = []
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}

    def run_forward(i: int) -> None:
        if not first:
            x = torch.empty(input_shape(i), dtype=dtype, device=_device(model))
            with watch("pipeline receive (activations)"):
                dist.recv(x, _peer(-1), tag=_TAG_FWD)
            x.requires_grad_(True)
            inputs[i] = x
            model.set_input_tensor(x)
        out = forward(i)
        if last:
            outputs[i] = loss(i, out)
        else:
            outputs[i] = out
            pending_sends.append((dist.isend(out.detach().contiguous(), _peer(1), tag=_TAG_FWD), out))

    def run_backward(i: int) -> None:
        out = outputs.pop(i)
        if last:
            with watch("micro-batch backward"):
                out.backward()
        else:
            grad = torch.empty_like(out)
            with watch("pipeline receive (gradients)"):
                dist.recv(grad, _peer(1), tag=_TAG_BWD)
            with watch("micro-batch backward"):
                torch.autograd.backward(out, grad)
        if not first:
            g = inputs.pop(i).grad
            pending_sends.append((dist.isend(g.contiguous(), _peer(-1), tag=_TAG_BWD), g))
        if on_backward is not None:
            on_backward(i)

    for i in range(warmup):
        run_forward(i)
    for i in range(warmup, num_micro_batches):
        run_forward(i)
        run_backward(i - warmup)
    for i in range(num_micro_batches - warmup, num_micro_batches):
        run_backward(i)
    for work, _keep in pending_sends:
        work.wait()
    if not first:
        model.set_input_tensor(None)


def forward_only(model, num_micro_batches: int, forward: Callable[[int], torch.Tensor],
                 input_shape: Callable[[int], tuple], collect: Callable[[int, torch.Tensor], None],
                 *, dtype: torch.dtype = torch.float32,
                 watch: Callable[[str], contextlib.AbstractContextManager] | None = None) -> None:
    """Forwards without backward (log-probs, values): each stage receives, runs and sends on;
    ``collect(i, output)`` on the last stage. With one stage: forward and collect per micro-batch."""
    watch = watch or _no_watch
    stage, stages = stage_info()
    first, last = stage == 0, stage == stages - 1
    pending = []
    for i in range(num_micro_batches):
        if not first:
            x = torch.empty(input_shape(i), dtype=dtype, device=_device(model))
            with watch("pipeline receive (activations)"):
                dist.recv(x, _peer(-1), tag=_TAG_FWD)
            model.set_input_tensor(x)
        out = forward(i)
        if last:
            collect(i, out)
        else:
            out = out.detach().contiguous()
            pending.append((dist.isend(out, _peer(1), tag=_TAG_FWD), out))
    for work, _keep in pending:
        work.wait()
    if not first:
        model.set_input_tensor(None)


def stage_input_shape(model, mb, *, sp_size: int = 1) -> tuple[int, int, int]:
    """The activation ``[s, b, h]`` a stage receives for micro-batch ``mb``: the fed positions (this
    rank's zig-zag share under context parallelism, ``rl.trainer.context``; then its sequence-parallel
    slice) x rows x hidden."""
    from rl.model.context_parallel import cp_group, padded_length

    cp = cp_group()[1]
    local = padded_length(mb.positions - 1, cp) // cp
    return (local // sp_size, len(mb.rows), model.t1_spec.hidden_size)


def run_forwards(model, plan: Sequence, forward: Callable, collect: Callable, *, sp_size: int = 1,
                 watch: Callable[[str], contextlib.AbstractContextManager] | None = None,
                 tick: Callable[[], None] | None = None) -> None:
    """:func:`forward_only` over the micro-batches ``plan``: ``forward(mb)`` on every stage, ``collect(mb, out)``
    on the last, ``tick()`` after each forward (with one stage: forward, collect per micro-batch)."""
    watch = watch or _no_watch

    def run(i: int):
        with watch("micro-batch forward"):
            out = forward(plan[i])
        if tick is not None:
            tick()
        return out

    forward_only(model, len(plan), run, lambda i: stage_input_shape(model, plan[i], sp_size=sp_size),
                 lambda i, out: collect(plan[i], out), watch=watch)


def run_updates(model, plan: Sequence, forward: Callable, loss: Callable, *, sp_size: int = 1,
                watch: Callable[[str], contextlib.AbstractContextManager] | None = None,
                tick: Callable[[], None] | None = None) -> None:
    """:func:`one_f_one_b` over ``plan``: gradients of ``loss(mb, forward(mb))`` (the loss on the last stage)
    accumulate in the parameters; ``tick()`` after each backward (with one stage: forward, loss, backward
    per micro-batch)."""
    watch = watch or _no_watch

    def run(i: int):
        with watch("micro-batch forward"):
            return forward(plan[i])

    one_f_one_b(model, len(plan), run, lambda i: stage_input_shape(model, plan[i], sp_size=sp_size),
                lambda i, out: loss(plan[i], out), on_backward=None if tick is None else (lambda i: tick()),
                watch=watch)


# --- results of the last stage -------------------------------------------------------------------------
def _last_stage_rank() -> int | None:
    """Global rank of the last stage of this rank's pipeline; None with one stage."""
    ps = _ps()
    if stage_info()[1] == 1:
        return None
    return dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())[-1]


def from_last_stage(value):
    """``value`` as the last stage holds it, on every stage of the pipeline: a tensor (same shape on every
    stage) is broadcast in place, any other object pickled. With one stage, ``value`` itself."""
    src = _last_stage_rank()
    if src is None:
        return value
    group = _ps().get_pipeline_model_parallel_group()
    if isinstance(value, torch.Tensor):
        dist.broadcast(value, src=src, group=group)
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def stage_routing_rows(model, batch, mb, num_fed: int) -> np.ndarray:
    """``[rows, num_fed, layers, K]``: the micro-batch's routing rows of the layers this pipeline stage holds
    (all of them with one stage), one row per fed position asserted per sample (:func:`stage_rows`)."""
    from rl.trainer.rows import routing_rows

    rows = list(routing_rows(batch, mb)[:, :num_fed].numpy())
    return np.stack(stage_rows(rows, num_fed, model, list(mb.rows)))


def stage_hidden(model, ids_bF: torch.Tensor) -> torch.Tensor:
    """A pipeline stage before the last: its layers' output ``[s, b, h]`` for the next stage (the first
    stage embeds ``ids_bF``; a later one runs on the activation the schedule set as its input)."""
    from rl.model.forward import _model_inputs

    return model(*_model_inputs(ids_bF))
