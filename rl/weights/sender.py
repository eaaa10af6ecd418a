"""The trainer's side of a weight sync: Hugging Face exports (disk) and broadcasts (distributed), fed by
every rank's own shard (docs/weights.md, "Every rank sends its shard").

:class:`WeightSender` is a mixin for the object that owns the published weights (the campaign's
trainer role at any world size, a benchmark, a test). It needs ``_published_weights(version) ->
(state, ModelSpec)``: this process's tensors of that version under the whole model's megatron names
(a world of 1, a test: the whole policy; a rank of a larger world: its shard) and
``configure_weight_sender(...)`` once. A rank of a larger world also overrides :meth:`weight_plan`
(who sends what, ``rl.weights.shard_plan``) and the two fan-out hooks (:meth:`_each_rank`,
:meth:`_on_rank`) that run a ``*_here`` method on its peers; the defaults are a process that holds
the whole policy and sends it all. Nothing here gathers the model: each *owner* rank hosts its own
weight-update group (a *channel*), broadcasts or exports the tensors it owns bucket by bucket, and
assembles a tensor-parallel tensor from its peers' pieces one tensor at a time.

Distributed sync takes a ``base``: the version every engine of the group holds. Given one (and
still held: :meth:`WeightSender.weight_holds`), the buckets carry only what changed since it
(``rl.weights.delta``), each rank comparing its own shard's two versions; without one, every tensor.
"""
from __future__ import annotations

import abc
import concurrent.futures as cf
import shutil
import socket
import time
from pathlib import Path
from typing import Mapping

import torch
import torch.distributed as dist

from rl.errors import InputError
from rl.hf import layout
from rl.hf.checkpoint import export_hf_parts, part_file, write_safetensors
from rl.model import ModelSpec
from rl.weights import delta
from rl.weights.buckets import Bucket, cut
from rl.weights.checksums import tensor_checksum
from rl.weights.group import destroy_update_group, dtype_name, init_update_group, send_tensors
from rl.weights.shard_plan import Send, owners, plan_whole, walk


class WeightSender(abc.ABC):
    """Publishes the owner's weights to the engines; the owner implements :meth:`_published_weights`."""

    _ws_group = None
    _ws_cache: tuple[tuple[str, str | None], list] | None = None
    _ws_rank = 0

    def configure_weight_sender(self, *, dtype: str = "bfloat16", bucket_bytes: int = 512 << 20,
                                master_address: str = "127.0.0.1", timeout_s: float = 600.0,
                                export_dir: str | None = None, keep_exports: int = 2) -> None:
        """``dtype``: what the engines serve (tensors are sent/exported in it); ``export_dir``: disk mode."""
        self._ws_dtype = getattr(torch, dtype)
        self._ws_bucket_bytes, self._ws_address, self._ws_timeout_s = int(bucket_bytes), master_address, timeout_s
        self._ws_export_dir = Path(export_dir) if export_dir else None
        self._ws_keep = keep_exports

    @abc.abstractmethod
    def _published_weights(self, version: str) -> tuple[Mapping[str, torch.Tensor], ModelSpec]:
        """This process's tensors of ``version`` under the whole model's names, and the ModelSpec."""

    # --- who sends what (overridden by a rank of a larger world) -----------------------------
    def weight_plan(self, version: str) -> list[Send]:
        """Every tensor's owner and pieces (``rl.weights.shard_plan``); here: this process sends it all."""
        state, spec = self._published_weights(version)
        return plan_whole(state, [u.mcore for u in layout.units(spec)])

    def _each_rank(self, method: str, *args) -> list:
        """``method`` on every rank of the trainer, concurrently, their answers in rank order."""
        return [getattr(self, method)(*args)]

    def _on_rank(self, rank: int, method: str, *args):
        """``method`` on one rank of the trainer."""
        if rank != self._ws_rank:
            raise InputError(f"rank {rank} is not this process (rank {self._ws_rank})", rank=rank)
        return getattr(self, method)(*args)

    def _p2p_send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor, dst)

    def _p2p_recv(self, tensor: torch.Tensor, src: int) -> None:
        dist.recv(tensor, src)

    def _walk(self, version: str, states: list, only=lambda s: True):
        return walk(self.weight_plan(version), self._ws_rank, states, send=self._p2p_send, recv=self._p2p_recv,
                    only=only)

    def _channel(self, plan: list[Send]) -> int:
        """This rank's place among the sending ranks: its weight-update group, its export file."""
        return owners(plan).index(self._ws_rank)

    def _units(self, spec: ModelSpec) -> dict:
        return {u.mcore: u for u in layout.units(spec)}

    # --- disk --------------------------------------------------------------------------
    def weight_export(self, version: str) -> str:
        """Write the Hugging Face export of ``version`` under ``export_dir`` (every owner rank writes its own
        safetensors file into it, ``weight_export_here``); keep the newest few."""
        if self._ws_export_dir is None:
            raise InputError("configure_weight_sender(export_dir=...) first: disk sync writes exports there")
        _, spec = self._published_weights(version)
        out = self._ws_export_dir / f"v{int(version):08d}" if version.isdigit() else self._ws_export_dir / f"v{version}"
        if out.exists():
            shutil.rmtree(out)  # a re-published version (resume) replaces its stale export
        parts = self.weight_channels(version)  # one file per sending rank
        export_hf_parts(out, spec, dtype_name(self._ws_dtype),
                        lambda tmp: self._each_rank("weight_export_here", version, str(tmp), parts),
                        meta={"role": "actor", "step": int(version) if version.isdigit() else version})
        for old in sorted(p for p in self._ws_export_dir.iterdir() if p.is_dir() and p.name.startswith("v"))[:-self._ws_keep]:
            shutil.rmtree(old, ignore_errors=True)
        return str(out)

    def weight_export_here(self, version: str, tmp_dir: str, num_parts: int) -> dict[str, str]:
        """This rank's part of an export: the tensors it owns, one safetensors file; ``{hf name: file}``."""
        state, spec = self._published_weights(version)
        plan, units = self.weight_plan(version), self._units(spec)
        mine = [s for s in plan if s.owner == self._ws_rank]
        if not mine:
            self._drain(self._walk(version, [state]))
            return {}
        name = part_file(self._channel(plan), num_parts)
        shapes = {n: tuple(p.shape) for s in mine
                  for n, p in zip(units[s.mcore].hf, units[s.mcore].split(torch.empty(s.shape, device="meta")))}

        walker = self._walk(version, [state])

        def tensors():
            for s, (whole,) in walker:
                for n, p in zip(units[s.mcore].hf, units[s.mcore].split(whole.detach())):
                    yield n, p.to("cpu", self._ws_dtype).contiguous()

        try:
            write_safetensors(Path(tmp_dir) / name, shapes, self._ws_dtype, tensors())
        finally:
            self._drain(walker)  # a failed write still completes this rank's point-to-point steps
        return {n: name for n in shapes}

    @staticmethod
    def _drain(walker) -> None:
        """Finish a walk without using what it yields: the peers waiting on this rank's pieces (or sending
        it theirs) are released, whatever failed here; the failure is raised by the caller."""
        for _ in walker:
            pass

    # --- distributed ----------------------------------------------------------------------
    def weight_channels(self, version: str) -> int:
        """How many weight-update groups the engines join: one per rank that sends anything."""
        return len(owners(self.weight_plan(version)))

    def weight_group_address(self, backend: str, channel: int = 0, version: str = "0") -> tuple[str, int]:
        """Where engines meet channel ``channel``'s owner rank: its configured address and a free port."""
        return self._on_rank(owners(self.weight_plan(version))[channel], "weight_group_address_here", backend)

    def weight_group_address_here(self, backend: str) -> tuple[str, int]:
        """Refuses a backend this torch lacks before any engine is asked to join (an engine would
        otherwise wait for a rank 0 that never comes, until the group timeout)."""
        if not dist.is_backend_available(backend):
            raise InputError(f"this trainer's torch has no {backend!r} backend; set engine.weight_sync_backend "
                             "(gloo for engines on CPU, nccl between GPUs)", backend=backend)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((self._ws_address if self._ws_address != "0.0.0.0" else "", 0))
            return self._ws_address, int(s.getsockname()[1])

    def weight_open_group(self, master_port: int, world_size: int, group_name: str, backend: str,
                          channel: int = 0, version: str = "0") -> str:
        """Channel ``channel``'s owner hosts its group as its rank 0; returns once every engine joined."""
        return self._on_rank(owners(self.weight_plan(version))[channel], "weight_open_group_here", master_port,
                             world_size, group_name, backend)

    def weight_open_group_here(self, master_port: int, world_size: int, group_name: str, backend: str) -> str:
        self.weight_close_group_here()
        self._ws_group = init_update_group(backend=backend, master_address=self._ws_address, master_port=master_port,
                                           rank=0, world_size=world_size, group_name=group_name,
                                           timeout_s=self._ws_timeout_s)
        return group_name

    def weight_close_group(self) -> None:
        self._each_rank("weight_close_group_here")

    def weight_close_group_here(self) -> None:
        if self._ws_group is not None:
            group, self._ws_group = self._ws_group, None
            try:
                destroy_update_group(group)
            except (RuntimeError, ValueError):  # a peer died with it: nothing left to tear down
                pass

    def weight_holds(self, version: str) -> bool:
        """Whether ``version``'s weights are still here (a delta needs its base; every rank keeps the same)."""
        try:
            self._published_weights(version)
        except (KeyError, ValueError, RuntimeError):
            return False
        return True

    def weight_buckets(self, version: str, base: str | None = None) -> list[Bucket]:
        """Names, dtypes, shapes, channel (and a delta's kinds) of each bucket of ``version``, whole or against
        ``base``, in the order the engines take them: channel by channel (what each request announces; a
        delta with nothing changed has none)."""
        return [b for part in self._each_rank("weight_buckets_here", version, base) for b in part]

    def weight_buckets_here(self, version: str, base: str | None = None) -> list[Bucket]:
        return [bucket for bucket, _ in self._buckets(version, base)]

    def _buckets(self, version: str, base: str | None) -> list[tuple[Bucket, list]]:
        """This rank's buckets: whole (their sends, converted when sent) or a delta (its entries, encoded here:
        both versions of each owned tensor are assembled once, compared and dropped)."""
        if self._ws_cache is not None and self._ws_cache[0] == (version, base):
            return self._ws_cache[1]
        state, spec = self._published_weights(version)
        plan, units = self.weight_plan(version), self._units(spec)
        channel = self._channel(plan) if any(s.owner == self._ws_rank for s in plan) else -1
        if base is None:
            entries = [[(n, "", p.to(self._ws_dtype), s) for n, p in zip(units[s.mcore].hf, units[s.mcore].split(
                torch.empty(s.shape, device="meta")))] for s in plan if s.owner == self._ws_rank]
        else:
            entries = []
            for s, (new, old) in self._walk(version, [state, self._published_weights(base)[0]]):
                u = units[s.mcore]
                entries.append([(n, kind, t, s) for n, a, b in zip(u.hf, u.split(new.detach()), u.split(old.detach()))
                                for kind, t in delta.encode(a.to(self._ws_dtype).contiguous(),
                                                            b.to(self._ws_dtype).contiguous())])
        buckets = cut(entries, self._ws_bucket_bytes, delta=base is not None, channel=channel)
        self._ws_cache = ((version, base), buckets)
        return buckets

    def weight_send(self, version: str, base: str | None = None) -> dict:
        """Every owner broadcasts its buckets of ``version`` (whole, or its delta against ``base``) on its
        channel, in order; returns the bytes, the seconds and the base."""
        t0 = time.perf_counter()
        sent = sum(self._each_rank("weight_send_here", version, base))
        return {"bytes": sent, "seconds": time.perf_counter() - t0, "base": base}

    def weight_send_here(self, version: str, base: str | None = None) -> int:
        buckets, sent = self._buckets(version, base), 0
        if buckets and self._ws_group is None:
            raise InputError("no weight-update group: weight_open_group first")
        if base is not None:  # a delta: encoded in weight_buckets
            for _, entries in buckets:
                sent += send_tensors([e[2] for e in entries], self._ws_group)
        else:  # whole tensors: assembled and converted bucket by bucket as the walk reaches them
            state, spec = self._published_weights(version)
            units, left = self._units(spec), iter(buckets)
            bucket, todo, ready = None, set(), []
            walker = self._walk(version, [state])
            try:
                for s, (whole,) in walker:
                    if not todo:
                        bucket = next(left)
                        todo = {e[-1].mcore for e in bucket[1]}
                    ready += [p.to(self._ws_dtype).contiguous() for p in units[s.mcore].split(whole.detach())]
                    todo.discard(s.mcore)
                    if not todo:
                        sent += send_tensors(ready, self._ws_group)
                        ready = []
            finally:  # a failed broadcast (an engine died) must not leave tensor-parallel peers waiting
                self._drain(walker)
        self._ws_cache = None  # the version's converted copy is not needed again
        return sent

    # --- verification ----------------------------------------------------------------------
    def weight_checksums(self, version: str) -> dict:
        """What the engines must hold after loading ``version``: ``{"dtype", "tensors": {name: checksum}}``
        of the published state cast to the dtype it is sent in (rl.weights.checksums), each tensor hashed
        by its owner."""
        sums: dict[str, str] = {}
        for part in self._each_rank("weight_checksums_here", version):
            sums.update(part)
        return {"dtype": dtype_name(self._ws_dtype), "tensors": sums}

    def weight_checksums_here(self, version: str) -> dict[str, str]:
        state, _ = self._published_weights(version)
        return {s.mcore: tensor_checksum(whole, self._ws_dtype) for s, (whole,) in self._walk(version, [state])}


def run_each(local, remote_calls: list) -> list:
    """Helper for :meth:`WeightSender._each_rank` overrides: ``local()`` on a thread while the peers'
    ``remote_calls`` (callables that block for their answer) run on others; answers in the given order."""
    with cf.ThreadPoolExecutor(1 + len(remote_calls), thread_name_prefix="weights-rank") as pool:
        futures = [pool.submit(local)] + [pool.submit(c) for c in remote_calls]
        return [f.result() for f in futures]
