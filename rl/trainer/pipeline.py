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
row per token and exactly the stage's layer count.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

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


def global_names(state: Mapping[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """Inverse of :func:`stage_state`: a stage's tensors under the whole model's names."""
    first = model.t1_layers[0]
    out = {}
    for name, tensor in state.items():
        layer = _layer_of(name)
        if layer is not None:
            parts = name.split(".")
            parts[2] = str(layer + first)
            name = ".".join(parts)
        out[name] = tensor
    return out


def gather_full(model) -> dict[str, torch.Tensor] | None:
    """The whole model (tp = 1) from every stage's tensors; on global rank 0, None elsewhere."""
    from rl import model as rmodel

    piece = global_names(rmodel.weights_state_dict(model), model)
    pieces = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(piece, pieces, dst=0)
    if pieces is None:
        return None
    full: dict[str, torch.Tensor] = {}
    for p in pieces:
        full.update(p)
    return full


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
def _peer(offset: int) -> int:
    ps = _ps()
    ranks = dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())
    return ranks[ps.get_pipeline_model_parallel_rank() + offset]


def one_f_one_b(model, num_micro_batches: int, forward: Callable[[int], torch.Tensor],
                input_shape: Callable[[int], tuple], loss: Callable[[int, torch.Tensor], torch.Tensor],
                *, dtype: torch.dtype = torch.float32, on_backward: Callable[[int], None] | None = None) -> None:
    """Forward and backward ``num_micro_batches`` micro-batches through this stage in 1F1B order.

    ``forward(i)`` runs the stage's model on micro-batch ``i`` (after ``model.set_input_tensor``, which
    this function calls with the received activation on every stage but the first) and returns its
    output: hidden states ``[s, b, h]`` on a stage before the last, anything on the last, where
    ``loss(i, output)`` gives the scalar to backpropagate. ``input_shape(i)``: the activation's shape
    arriving at this stage. Gradients accumulate in the parameters, as the micro-batch loop's do.
    With one stage this is forward, loss, backward per micro-batch."""
    stage, stages = stage_info()
    first, last = stage == 0, stage == stages - 1
    warmup = min(stages - stage - 1, num_micro_batches)
    pending_sends: list = []
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}

    def run_forward(i: int) -> None:
        if not first:
            x = torch.empty(input_shape(i), dtype=dtype)
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
            out.backward()
        else:
            grad = torch.empty(out.shape, dtype=out.dtype)
            dist.recv(grad, _peer(1), tag=_TAG_BWD)
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
                 *, dtype: torch.dtype = torch.float32) -> None:
    """Forwards without backward (log-probs, values): each stage receives, runs and sends on;
    ``collect(i, output)`` on the last stage."""
    stage, stages = stage_info()
    first, last = stage == 0, stage == stages - 1
    pending = []
    for i in range(num_micro_batches):
        if not first:
            x = torch.empty(input_shape(i), dtype=dtype)
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


def policy_stage_forward(model, batch, mb, *, replay: bool, temperature: float = 1.0) -> torch.Tensor:
    """One micro-batch through this stage of the policy: hidden states ``[s, b, h]`` on a stage before the
    last, fp32 token-aligned log-probs ``[rows, positions]`` on the last (``rl.trainer.rank_forward``)."""
    import contextlib

    from rl import model as rmodel
    from rl.model.forward import _model_inputs
    from rl.trainer import rank_forward as rf
    from rl.trainer.batch import PAD_TOKEN_ID
    from rl.trainer.forward import shift_to_tokens

    tokens = rf.slice_rows(batch.tokens_BT, mb, fill=PAD_TOKEN_ID)
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    replaying = contextlib.nullcontext()
    if replay:
        rows = list(rf.routing_rows(batch, mb)[:, : ids.shape[1]].numpy())
        replaying = rmodel.replay_routing(model, stage_rows(rows, ids.shape[1], model, mb.rows))
    with replaying:
        if model.post_process:
            return shift_to_tokens(rmodel.token_logprobs(model, ids, targets, temperature))
        return model(*_model_inputs(ids))


def hidden_shape(model, mb) -> tuple[int, int, int]:
    """The activation ``[s, b, h]`` a stage receives for micro-batch ``mb``."""
    return (mb.positions - 1, len(mb.rows), model.t1_spec.hidden_size)
