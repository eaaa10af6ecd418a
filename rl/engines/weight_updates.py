"""The embedded engine's weight-update endpoints, in SGLang's schemas.

- ``/update_weights_from_disk`` of a Hugging Face directory (``rl.hf.checkpoint``: what a real
  server loads; a ``t1ops.json`` naming another role than actor is refused). The legacy t1ops
  step directory (``weights.pt`` + ``manifest.json``) stays with :mod:`rl.engines.embedded_engine`.
- ``/init_weights_update_group``, ``/update_weights_from_distributed``,
  ``/destroy_weights_update_group`` (:mod:`rl.engines.protocol_weights`): join the trainer's
  group (:mod:`rl.weights.group`, gloo on CPU), receive one broadcast per Hugging Face tensor,
  convert with :mod:`rl.hf.layout` and load. A request with ``delta_base`` is a delta
  (:mod:`rl.weights.delta`): received whole (the broadcast completes on every rank), refused by
  name unless ``delta_base`` is this engine's version, then applied to the engine's own tensors.

Loading is all-or-nothing per request: names, units and shapes are checked before any copy,
and the copy happens under the engine's model lock, so no token step sees half a bucket.
Requests are received outside the lock (the barrier has paused generation already; a request
that arrives anyway sees the old weights until the copy).

``POST /weights_checksum`` (a t1ops endpoint; body ``{"dtype"}``) answers the checksum of every
tensor *in the model now* (:mod:`rl.weights.checksums`), so the barrier can prove the load
matched what the trainer sent. The chaos switch ``--chaos-corrupt-weight-bucket N`` reorders
two same-shaped tensors of the N-th bucket this engine receives (repeatable) (or reverses one's bytes) on
its way from the receive to the load, a delta bucket's entries too: the silent corruption of SkyRL
issue #1680.
"""
from __future__ import annotations

import dataclasses
import threading
from http import HTTPStatus
from typing import Any, Callable

import torch

from rl.engines import protocol_control as PC
from rl.engines import protocol_weights as PW
from rl.errors import CheckpointError, InputError, T1OpsError
from rl.hf import layout
from rl.hf.checkpoint import check_actor_export, import_hf
from rl.model import weights_state_dict
from rl.weights.checksums import state_checksums
from rl.weights import delta
from rl.weights.group import destroy_update_group, init_update_group, parse_dtype, receive_list

WEIGHTS_CHECKSUM = "/weights_checksum"

# The failure ids of docs/failures.md this guard catches (`t1ops explain ID`): tensors are received
# outside the model lock and loaded under ``with`` it, so a failed broadcast never leaves it held.
CATCHES = {
    "sync-failure-lock": (),
}


def load_partial(engine, state: dict[str, torch.Tensor]) -> None:
    """Copy megatron-named tensors into ``engine.model`` (cast to its dtype); all checked first."""
    current = weights_state_dict(engine.model)
    wrong = [f"{n}: {tuple(t.shape)} vs {tuple(current[n].shape) if n in current else 'absent'}"
             for n, t in state.items() if n not in current or current[n].shape != t.shape]
    if wrong:
        raise CheckpointError(f"{len(wrong)} tensor(s) do not fit the served model (first: {wrong[:3]}); the "
                              "trainer and the engine must run the same ModelSpec", mismatched=wrong[:10])
    with engine._model_lock, torch.no_grad():
        for name, tensor in state.items():
            current[name].copy_(tensor)
        if hasattr(engine, "weights_generation"):  # cached K/V of the old weights is stale (rl.engines.batching)
            engine.weights_generation += 1


def update_from_hf_dir(engine, request: PC.UpdateWeightsFromDiskRequest) -> None:
    """Load a Hugging Face export into the engine (``/update_weights_from_disk``)."""
    meta = check_actor_export(request.model_path)
    spec, state = import_hf(request.model_path)
    if dataclasses.replace(spec, max_seq_len=engine.spec.max_seq_len) != engine.spec:
        raise CheckpointError(f"{request.model_path} holds {spec}, the engine serves {engine.spec}",
                              path=request.model_path)
    if request.abort_all_requests:
        engine.abort("", abort_all=True)
    full = weights_state_dict(engine.model)
    if set(state) != set(full):
        raise CheckpointError(f"{request.model_path} lacks {sorted(set(full) - set(state))[:3]}", path=request.model_path)
    load_partial(engine, state)
    with engine._model_lock:
        engine.weight_version = request.weight_version or str(meta.get("step", engine.weight_version))
        engine.model_path = str(request.model_path)


class WeightReceiver:
    """The engine's weight-update groups by name (SGLang keeps the same map)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.groups: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.num_buckets = 0  # buckets received so far (the chaos switch counts them)
        self.chaos_corrupt_buckets: tuple[int, ...] = getattr(engine, "chaos_corrupt_buckets", ())

    def init_group(self, request: PW.InitWeightsUpdateGroupRequest) -> str:
        with self._lock:
            if request.group_name in self.groups:
                raise InputError(f"weight-update group {request.group_name!r} exists; destroy it first")
        group = init_update_group(backend=request.backend, master_address=request.master_address,
                                  master_port=request.master_port, rank=request.rank_offset,  # tp_rank 0
                                  world_size=request.world_size, group_name=request.group_name)
        with self._lock:
            self.groups[request.group_name] = group
        return f"joined {request.group_name} as rank {request.rank_offset} of {request.world_size}"

    def update(self, request: PW.UpdateWeightsFromDistributedRequest) -> str:
        group = self.groups.get(request.group_name)
        if group is None:
            raise InputError(f"no weight-update group {request.group_name!r}; call /init_weights_update_group first")
        wire = receive_list(request.names, request.dtypes, request.shapes, group)
        self.num_buckets += 1
        if self.num_buckets in self.chaos_corrupt_buckets:
            wire = _chaos_reorder(list(request.names), wire, self.num_buckets)
        if request.delta_base is not None:
            delta.check_base(request.delta_base, self.engine.weight_version, "update_weights_from_distributed")
            hf = self._patched(list(zip(request.names, request.delta_kinds, wire)))
        else:
            hf = dict(zip(request.names, wire))
        layout.check_shapes(hf, self.engine.spec)
        state = layout.from_hf(hf, self.engine.spec, partial=True)
        if request.abort_all_requests:
            self.engine.abort("", abort_all=True)
        load_partial(self.engine, state)
        if request.weight_version is not None:
            with self.engine._model_lock:
                self.engine.weight_version = request.weight_version
        return f"loaded {len(hf)} tensors" + (f"; weight version {request.weight_version}"
                                               if request.weight_version is not None else "")

    def _patched(self, entries: list[tuple[str, str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Every HF tensor of the units a delta touches: the changed ones patched from the engine's
        own tensors (in the wire dtype), the unchanged pieces of those units as they are."""
        unit_of = {name: u for u in layout.units(self.engine.spec) for name in u.hf}
        unknown = sorted({n for n, _, _ in entries} - set(unit_of))
        if unknown:
            raise CheckpointError(f"delta names {len(unknown)} tensor(s) outside the served layout (first: "
                                  f"{unknown[:3]})", unknown=unknown[:10])
        wire_dtype = {n: t.dtype for n, k, t in entries if k != delta.INDEX}
        model = weights_state_dict(self.engine.model)
        current: dict[str, torch.Tensor] = {}
        for unit in {unit_of[n].mcore: unit_of[n] for n, _, _ in entries}.values():
            dtype = next((wire_dtype[n] for n in unit.hf if n in wire_dtype), model[unit.mcore].dtype)
            current.update(zip(unit.hf, (p.to(dtype) for p in unit.split(model[unit.mcore].detach()))))
        return {**current, **delta.apply(entries, current)}

    def destroy(self, request: PW.DestroyWeightsUpdateGroupRequest) -> str:
        with self._lock:
            group = self.groups.pop(request.group_name, None)
        if group is None:
            raise InputError(f"no weight-update group {request.group_name!r} to destroy")
        destroy_update_group(group)
        return f"destroyed {request.group_name}"


def _chaos_reorder(names: list[str], wire: list[torch.Tensor], number: int) -> list[torch.Tensor]:
    """Chaos only: two same-shaped tensors of this bucket swap places (else one's elements reverse)."""
    wire = list(wire)
    weights = [i for i, t in enumerate(wire) if t.is_floating_point()]  # a delta's positions stay in range
    for i in weights:
        j = next((j for j in weights if j > i and wire[j].shape == wire[i].shape and wire[j].dtype == wire[i].dtype
                  and not torch.equal(wire[j], wire[i])), None)
        if j is not None:
            wire[i], wire[j] = wire[j], wire[i]
            print(f"chaos: bucket {number}: tensors {names[i]} and {names[j]} swapped in transit", flush=True)
            return wire
    i = next((i for i in weights if not torch.equal(wire[i].reshape(-1).flip(0), wire[i].reshape(-1))), 0)
    wire[i] = wire[i].reshape(-1).flip(0).reshape(wire[i].shape)
    print(f"chaos: bucket {number}: elements of {names[i]} reversed in transit", flush=True)
    return wire


def weights_checksum(engine, body: Any) -> tuple[int, Any]:
    """``POST /weights_checksum``: ``{"weight_version", "dtype", "tensors": {name: checksum}}`` of the
    tensors in the served model now, cast to the body's ``dtype`` (the one the trainer sent)."""
    if not isinstance(body, dict) or not isinstance(body.get("dtype"), str):
        raise InputError("weights_checksum: body needs a string 'dtype' (e.g. 'bfloat16')", field="dtype")
    dtype = parse_dtype(body["dtype"])
    with engine._model_lock:
        tensors = state_checksums(weights_state_dict(engine.model), dtype)
        version = engine.weight_version
    return HTTPStatus.OK, {"weight_version": version, "dtype": body["dtype"], "tensors": tensors}


def _answer(call: Callable[[], str]) -> tuple[int, Any]:
    """SGLang's answer: 200 + success true, or 400 + success false with the reason."""
    try:
        return HTTPStatus.OK, PW.WeightsResponse(True, call()).to_json()
    except (T1OpsError, RuntimeError, ValueError) as exc:  # a failed rendezvous/broadcast is a RuntimeError
        return HTTPStatus.BAD_REQUEST, PW.WeightsResponse(False, f"{type(exc).__name__}: {exc}").to_json()


def routes(engine, body: Callable[[], Any]) -> dict[str, Callable[[], tuple[int, Any]]]:
    """POST routes for :mod:`rl.engines.embedded_http`'s handler (``body()`` reads the request JSON)."""
    receiver = engine.__dict__.setdefault("_weight_receiver", WeightReceiver(engine))
    return {
        PW.INIT_WEIGHTS_UPDATE_GROUP: lambda: _answer(
            lambda: receiver.init_group(PW.InitWeightsUpdateGroupRequest.from_json(body()))),
        PW.UPDATE_WEIGHTS_FROM_DISTRIBUTED: lambda: _answer(
            lambda: receiver.update(PW.UpdateWeightsFromDistributedRequest.from_json(body()))),
        PW.DESTROY_WEIGHTS_UPDATE_GROUP: lambda: _answer(
            lambda: receiver.destroy(PW.DestroyWeightsUpdateGroupRequest.from_json(body()))),
        WEIGHTS_CHECKSUM: lambda: weights_checksum(engine, body()),
    }
