"""Per-rank checkpoint shards under one checksummed manifest, loadable at any layout.

A multi-rank trainer saves each role without gathering it: every rank writes
its own shard (its tensors and where each sits in the full tensor,
``rl.trainer.shard.Placement``), then rank 0 writes ``manifest.json`` naming
the role, the step, the layout and every shard's sha256. The manifest is
written last, atomically: a step directory without one is an interrupted save
and never loads. Roles stay separated as in ``t1ops.guards.checkpoints``
(``<base>/actor-shards``, ``<base>/critic-shards``; a manifest naming another
role is refused).

Loading reassembles the full, layout-free state (``rl.trainer.shard.assemble``)
after checking every shard's checksum, so a checkpoint saved at TP = 2 loads
into a DP = 2, an EP = 2 or a 1-rank trainer (``RankTrainer.load_full``).

Layout: ``<base>/<role>-shards/step_00000004/{rank00000.pt, ..., manifest.json}``.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Mapping

import torch

from rl.atomic import publish_file
from rl.trainer.shard import Placement, assemble
from t1ops import telemetry
from t1ops.errors import CheckpointError, CheckpointRoleError
from t1ops.guards.checkpoints import MANIFEST_FILE, _check_role, file_sha256, step_dir_name

SHARDED_VERSION = 1


def shard_dir(base: str | Path, role: str, step: int) -> Path:
    return Path(base) / f"{_check_role(role)}-shards" / step_dir_name(step)


def write_shard(base: str | Path, role: str, step: int, rank: int, where: Mapping[str, Placement],
                state: Mapping[str, torch.Tensor]) -> dict:
    """This rank's shard (atomic rename); returns its manifest entry (file, sha256, bytes)."""
    out = shard_dir(base, role, step)
    out.mkdir(parents=True, exist_ok=True)
    path = publish_file(out / f"rank{rank:05d}.pt", lambda f: torch.save(
        {"placements": {k: asdict(p) for k, p in where.items()},
         "state": {k: v.detach().cpu() for k, v in state.items()}}, f))
    return {"rank": rank, "file": path.name, "sha256": file_sha256(path), "bytes": path.stat().st_size}


def write_manifest(base: str | Path, role: str, step: int, layout: Mapping, shards: list[dict]) -> Path:
    """Rank 0, after every shard is written: the commit point of the step."""
    out = shard_dir(base, role, step)
    manifest = {"version": SHARDED_VERSION, "role": role, "step": step, "layout": dict(layout),
                "shards": sorted(shards, key=lambda s: s["rank"])}
    publish_file(out / MANIFEST_FILE, json.dumps(manifest, indent=1))  # the commit point, durable
    telemetry.event("checkpoint.sharded_saved", role=role, step=step, shards=len(shards),
                    bytes=sum(s["bytes"] for s in shards))
    return out


def save_sharded(base: str | Path, role: str, step: int, trainer) -> Path | None:
    """Every rank of ``trainer`` (a ``RankTrainer``) writes its shard; rank 0 commits the manifest.

    A collective (the entries are gathered to rank 0); returns the step directory on rank 0."""
    import torch.distributed as dist

    where, state = trainer.shard(role)
    entry = write_shard(base, role, step, dist.get_rank(), where, state)
    entries = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(entry, entries, dst=0)
    if entries is None:
        return None
    return write_manifest(base, role, step, trainer.layout.model_dump(), entries)


def load_full(step_dir: str | Path, role: str) -> tuple[dict[str, torch.Tensor], dict]:
    """The full state of ``role`` from a sharded step directory, every checksum verified."""
    step_dir = Path(step_dir)
    path = step_dir / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointError(f"{step_dir} has no {MANIFEST_FILE}: the save was interrupted before rank 0 "
                              "committed it; load an earlier step", path=str(step_dir))
    manifest = json.loads(path.read_text())
    if manifest.get("role") != role:
        raise CheckpointRoleError(f"{step_dir} holds {manifest.get('role')!r} shards, asked for {role!r}; "
                                  "actor and critic checkpoints are separate", path=str(step_dir), role=role)
    pieces = []
    for entry in manifest["shards"]:
        shard = step_dir / entry["file"]
        if not shard.is_file() or file_sha256(shard) != entry["sha256"]:
            raise CheckpointError(f"shard {shard} of {role} step {manifest['step']} is missing or does not match "
                                  f"its manifest checksum; the checkpoint is corrupt, load an earlier step",
                                  path=str(shard))
        blob = torch.load(shard, map_location="cpu", weights_only=True)
        pieces.append(({k: Placement(**p) for k, p in blob["placements"].items()}, blob["state"]))
    return assemble(pieces), manifest
