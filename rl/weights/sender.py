"""The trainer's side of a weight sync: Hugging Face exports (disk) and broadcasts (distributed).

:class:`WeightSender` is a mixin for the object that owns the published weights (the
campaign's trainer role, a benchmark, a test). It needs ``_published_weights(version) ->
(megatron state, ModelSpec)`` and ``configure_weight_sender(...)`` once. Every method is a
plain call, so a Ray actor exposes them as remote methods unchanged.

Distributed sync takes a ``base``: the version every engine of the group holds. Given one (and
still held: :meth:`WeightSender.weight_holds`), the buckets carry only what changed since it
(``rl.weights.delta``); without one, every tensor.
"""
from __future__ import annotations

import abc
import shutil
import socket
import time
from pathlib import Path
from typing import Mapping

import torch

from rl.errors import InputError
from rl.model import ModelSpec
from rl.weights.buckets import Bucket, hf_buckets, hf_delta_buckets
from rl.weights.checksums import state_checksums
from rl.weights.group import destroy_update_group, dtype_name, init_update_group, send_tensors


class WeightSender(abc.ABC):
    """Publishes the owner's weights to the engines; the owner implements :meth:`_published_weights`."""

    _ws_group = None
    _ws_cache: tuple[tuple[str, str | None], list] | None = None

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
        """The weights published as ``version``: the megatron state (full, by name) and its ModelSpec."""

    # --- disk --------------------------------------------------------------------------
    def weight_export(self, version: str) -> str:
        """Write the Hugging Face export of ``version`` under ``export_dir``; keep the newest few."""
        from rl.hf.checkpoint import export_hf

        if self._ws_export_dir is None:
            raise InputError("configure_weight_sender(export_dir=...) first: disk sync writes exports there")
        state, spec = self._published_weights(version)
        out = self._ws_export_dir / f"v{int(version):08d}" if version.isdigit() else self._ws_export_dir / f"v{version}"
        if out.exists():
            shutil.rmtree(out)  # a re-published version (resume) replaces its stale export
        export_hf(state, spec, out, dtype=str(self._ws_dtype).removeprefix("torch."),
                  meta={"role": "actor", "step": int(version) if version.isdigit() else version},
                  tokenizer=False)
        for old in sorted(p for p in self._ws_export_dir.iterdir() if p.is_dir() and p.name.startswith("v"))[:-self._ws_keep]:
            shutil.rmtree(old, ignore_errors=True)
        return str(out)

    # --- distributed ----------------------------------------------------------------------
    def weight_group_address(self, backend: str) -> tuple[str, int]:
        """Where engines meet rank 0: the configured address and a free port on this host.

        Refuses a backend this torch lacks before any engine is asked to join (an engine would
        otherwise wait for a rank 0 that never comes, until the group timeout)."""
        import torch.distributed as dist

        if not dist.is_backend_available(backend):
            raise InputError(f"this trainer's torch has no {backend!r} backend; set engine.weight_sync_backend "
                             "(gloo for engines on CPU, nccl between GPUs)", backend=backend)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((self._ws_address if self._ws_address != "0.0.0.0" else "", 0))
            return self._ws_address, int(s.getsockname()[1])

    def weight_open_group(self, master_port: int, world_size: int, group_name: str, backend: str) -> str:
        """Host the group as rank 0; returns once every engine joined (or the group timeout)."""
        self.weight_close_group()
        self._ws_group = init_update_group(backend=backend, master_address=self._ws_address, master_port=master_port,
                                           rank=0, world_size=world_size, group_name=group_name,
                                           timeout_s=self._ws_timeout_s)
        return group_name

    def weight_close_group(self) -> None:
        if self._ws_group is not None:
            group, self._ws_group = self._ws_group, None
            try:
                destroy_update_group(group)
            except (RuntimeError, ValueError):  # a peer died with it: nothing left to tear down
                pass

    def weight_holds(self, version: str) -> bool:
        """Whether ``version``'s weights are still here (a delta needs its base)."""
        try:
            self._published_weights(version)
        except (KeyError, ValueError, RuntimeError):
            return False
        return True

    def _buckets(self, version: str, base: str | None) -> list[tuple[Bucket, list[torch.Tensor]]]:
        if self._ws_cache is None or self._ws_cache[0] != (version, base):
            state, spec = self._published_weights(version)
            if base is None:
                buckets = hf_buckets(state, spec, self._ws_dtype, self._ws_bucket_bytes)
            else:
                buckets = hf_delta_buckets(state, self._published_weights(base)[0], spec, self._ws_dtype,
                                           self._ws_bucket_bytes)
            self._ws_cache = ((version, base), buckets)
        return self._ws_cache[1]

    def weight_buckets(self, version: str, base: str | None = None) -> list[Bucket]:
        """Names, dtypes and shapes (and a delta's kinds) of each bucket of ``version``, whole or
        against ``base`` (what each request announces; a delta with nothing changed has none)."""
        return [bucket for bucket, _ in self._buckets(version, base)]

    def weight_send(self, version: str, base: str | None = None) -> dict:
        """Broadcast every bucket of ``version`` (whole, or its delta against ``base``) in order;
        returns the bytes, the seconds and the base."""
        if self._ws_group is None:
            raise InputError("no weight-update group: weight_open_group first")
        t0, sent = time.perf_counter(), 0
        for _, tensors in self._buckets(version, base):
            sent += send_tensors(tensors, self._ws_group)
        self._ws_cache = None  # the version's converted copy is not needed again
        return {"bytes": sent, "seconds": time.perf_counter() - t0, "base": base}

    # --- verification ----------------------------------------------------------------------
    def weight_checksums(self, version: str) -> dict:
        """What the engines must hold after loading ``version``: ``{"dtype", "tensors": {name: checksum}}``
        of the published state cast to the dtype it is sent in (rl.weights.checksums)."""
        state, _ = self._published_weights(version)
        return {"dtype": dtype_name(self._ws_dtype), "tensors": state_checksums(state, self._ws_dtype)}
