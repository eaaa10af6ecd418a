"""Checkpoints by shard: every rank saves its own slice, readers take only the pieces they need.

A multi-rank trainer saves each role without gathering it (docs/parallelism.md, "Checkpoints by
shard"): every rank writes its own shard (its tensors and where each sits in the full tensor,
``rl.trainer.shard.Placement``) into ``<base>/<role>/.partial-step_N/``, then rank 0 writes
``manifest.json`` (the role, the step, the layout, every shard's sha256, and per full tensor its
shape, dtype and which rank holds which slice) and renames the directory to ``step_N``: a step
directory exists complete or not at all, as ``save_checkpoint``'s do. Roles stay in their own
directories (``<base>/actor``, ``<base>/critic``; a manifest naming another role is refused), so
retention, resume planning and the HF export see one kind of step directory whatever the world
size; a world of 1 keeps the single-file format (``weights.pt``: its shard is the full state).

:class:`CheckpointReader` reads either format lazily: each file's checksum is verified (streamed),
its tensors are memory-mapped (``torch.load(mmap=True)``), and ``reader[name]`` assembles one full
tensor from its slices on demand. A rank resuming at the saved layout loads its own file
(:meth:`CheckpointReader.own`); at another layout it cuts its pieces tensor by tensor
(``RankTrainer.load_role``), so no process holds more than its shard plus one full tensor.

Layout: ``<base>/<role>/step_00000004/{rank00000.pt, ..., manifest.json}``.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import torch

from rl.atomic import fsync_dir, publish_file
from rl.trainer.shard import Placement
from t1ops import telemetry
from t1ops.errors import CheckpointError, CheckpointRoleError
from t1ops.guards.checkpoints import (MANIFEST_FILE, WEIGHTS_FILE, _check_role, _refuse_foreign_dir, file_sha256,
                                      load_checkpoint, read_manifest, step_dir_name, tensor_sha256)

SHARDED_VERSION = 2
PARTIAL = ".partial-"


def shard_dir(base: str | Path, role: str, step: int) -> Path:
    """The step directory of ``role`` under the checkpoint base (the role's own directory)."""
    return Path(base) / _check_role(role) / step_dir_name(step)


def is_sharded(manifest: Mapping) -> bool:
    return "shards" in manifest


def write_shard(out: Path, rank: int, where: Mapping[str, Placement], state: Mapping[str, torch.Tensor]) -> dict:
    """This rank's shard file in ``out`` (atomic rename); returns its manifest entry (file, sha256, pieces)."""
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach() for k, v in state.items()}  # torch.save copies a device tensor to host one at a time
    path = publish_file(out / f"rank{rank:05d}.pt", lambda f: torch.save(
        {"placements": {k: asdict(p) for k, p in where.items()}, "state": state}, f))
    pieces = {k: {**asdict(p), "shape": list(state[k].shape), "dtype": str(state[k].dtype).removeprefix("torch.")}
              for k, p in where.items()}
    return {"rank": rank, "file": path.name, "sha256": file_sha256(path), "bytes": path.stat().st_size,
            "pieces": pieces}


def _full_shape(piece: dict) -> list[int]:
    shape = list(piece["shape"])
    if piece["dim"] is not None:
        shape[piece["dim"]] *= piece["count"]
    return shape


def commit(partial: Path, final: Path, role: str, step: int, layout: Mapping, entries: list[dict]) -> Path:
    """Rank 0, after every shard is written: the manifest, then ``partial`` renamed to ``final``."""
    _refuse_foreign_dir(final.parent, role)
    tensors: dict[str, dict] = {}
    for entry in sorted(entries, key=lambda e: e["rank"]):
        for name, piece in entry.pop("pieces").items():
            meta = tensors.setdefault(piece["full_name"], {"shape": _full_shape(piece), "dtype": piece["dtype"],
                                                           "pieces": []})
            meta["pieces"].append({"rank": entry["rank"], "name": name,
                                   **{k: piece[k] for k in ("dim", "index", "count", "sections")}})
    manifest = {"version": SHARDED_VERSION, "role": role, "step": step, "layout": dict(layout),
                "world_size": len(entries), "shards": sorted(entries, key=lambda e: e["rank"]), "tensors": tensors}
    publish_file(partial / MANIFEST_FILE, json.dumps(manifest, indent=1))
    os.rename(partial, final)  # the commit point: the step directory appears complete
    fsync_dir(final.parent)
    for stale in final.parent.glob(PARTIAL + "*"):  # saves a crash interrupted (every rank of this one is done)
        shutil.rmtree(stale, ignore_errors=True)
    telemetry.event("checkpoint.sharded_saved", role=role, step=step, shards=len(entries),
                    bytes=sum(s["bytes"] for s in entries), path=str(final))
    return final


def save_sharded(base: str | Path, role: str, step: int, trainer) -> Path | None:
    """Every rank of ``trainer`` (a ``RankTrainer``) writes its shard of ``role``; rank 0 commits.

    A collective (the entries are gathered to rank 0, not the tensors); returns the step directory on rank 0."""
    import torch.distributed as dist

    final = shard_dir(base, role, step)
    if final.exists():
        raise CheckpointError(f"checkpoint {final} already exists and is never overwritten; resume from it or "
                              "remove it by hand", path=str(final), role=role, step=step)
    partial = final.with_name(PARTIAL + final.name)
    where, state = trainer.shard(role)
    entry = write_shard(partial, dist.get_rank(), where, state)
    del state
    entries = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(entry, entries, dst=0)
    if entries is None:
        return None
    return commit(partial, final, role, step, trainer.layout.model_dump(), entries)


class CheckpointReader(Mapping):
    """A verified step directory (sharded or single-file) as a lazy full state: ``reader[name]`` is one full
    tensor, assembled from its slices when asked (see the module docstring)."""

    def __init__(self, step_dir: str | Path, role: str) -> None:
        self.step_dir, self.role = Path(step_dir), _check_role(role)
        self.manifest = read_manifest(self.step_dir)
        if self.manifest["role"] != role:
            raise CheckpointRoleError(f"checkpoint {self.step_dir} holds the {self.manifest['role']}'s weights, not "
                                      f"the {role}'s; load the sibling directory ({self.step_dir.parent.parent / role})",
                                      role=role, found_role=self.manifest["role"], path=str(self.step_dir))
        entries = self.manifest["shards"] if is_sharded(self.manifest) else \
            [{"rank": 0, "file": WEIGHTS_FILE, "sha256": self.manifest["file_sha256"]}]
        self._files: dict[int, dict] = {}
        for entry in entries:
            path = self.step_dir / entry["file"]
            if not path.is_file() or file_sha256(path) != entry["sha256"]:
                telemetry.event("checkpoint.refused", severity="error", reason="checksum", path=str(path))
                raise CheckpointError(f"{path} of the {role} step {self.manifest['step']} is missing or does not match "
                                      "its manifest checksum; the checkpoint is corrupt, nothing was loaded: load an "
                                      "earlier step", path=str(path))
            self._files[entry["rank"]] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        self._tensors = self.manifest["tensors"] if is_sharded(self.manifest) else \
            {k: {**meta, "pieces": [{"rank": 0, "name": k, "dim": None}]}
             for k, meta in self.manifest["tensors"].items()}

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self):
        return iter(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name]["shape"])

    def _local(self, rank: int, name: str) -> torch.Tensor:
        blob = self._files[rank]
        return blob["state"][name] if is_sharded(self.manifest) else blob[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        meta = self._tensors[name]
        first = meta["pieces"][0]
        if first["dim"] is None:
            t = self._local(first["rank"], first["name"])
            if not is_sharded(self.manifest) and tensor_sha256(t) != meta["sha256"]:
                raise CheckpointError(f"checkpoint {self.step_dir} tensor {name!r} differs from its manifest",
                                      path=str(self.step_dir), tensor=name)
            return t
        by_index = {}
        for p in meta["pieces"]:
            by_index.setdefault(p["index"], p)
        if sorted(by_index) != list(range(first["count"])):
            raise CheckpointError(f"{self.step_dir}: {name} has slices {sorted(by_index)} of {first['count']}; a "
                                  "rank's shard is missing", path=str(self.step_dir), tensor=name)
        placement = Placement(name, first["dim"], 0, first["count"], tuple(first["sections"]))
        return placement.join([self._local(by_index[i]["rank"], by_index[i]["name"]) for i in range(first["count"])])

    def own(self, rank: int) -> tuple[dict[str, Placement], dict[str, torch.Tensor]] | None:
        """(placements, tensors) of ``rank``'s file (a single-file checkpoint is rank 0's, every tensor whole;
        None: no such rank); the loader uses it only when its placements are exactly the loading rank's."""
        if rank not in self._files:
            return None
        if not is_sharded(self.manifest):
            return {k: Placement(k, None) for k in self._tensors}, {k: self._files[0][k] for k in self._tensors}
        blob = self._files[rank]
        return {k: Placement(**{**p, "sections": tuple(p["sections"])}) for k, p in blob["placements"].items()}, \
            blob["state"]


def load_into(trainer, role: str, step_dir: str | Path, rank: int) -> str:
    """``role`` of the checkpoint in ``step_dir`` into ``trainer`` (a ``RankTrainer``) on ``rank``: its own
    file when the checkpoint was saved at this layout, else its pieces re-sharded tensor by tensor (the
    counterpart of :func:`save_sharded`). Returns which ("own shard" / "re-sharded")."""
    reader = CheckpointReader(step_dir, role)
    return trainer.load_role(role, reader, reader.own(rank))  # the reader's memory maps close with it


def load_role(step_dir: str | Path, role: str) -> tuple[dict[str, torch.Tensor], dict]:
    """The full state of ``role`` from either format, every checksum verified (one process holds it all:
    for tools and 1-rank loads; ranks use :class:`CheckpointReader` and ``RankTrainer.load_role``)."""
    reader = CheckpointReader(step_dir, role)
    return {k: reader[k].clone() for k in reader}, reader.manifest


def verify_role(step_dir: str | Path, role: str) -> dict:
    """Raise CheckpointError unless ``step_dir`` is a complete, uncorrupted checkpoint of ``role`` (either
    format; a sharded one by its files' checksums, never assembled); returns its manifest."""
    if is_sharded(read_manifest(step_dir)):
        return CheckpointReader(step_dir, role).manifest
    return load_checkpoint(step_dir, role)[1]
