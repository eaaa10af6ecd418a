"""Full (layout-free) weights <-> one rank's shard of them.

A full state is what a world of 1 holds (``rl.model.weights_state_dict``):
the engines load it and checkpoints can be reassembled into it at any layout.
One rank of a megatron layout holds (docs/parallelism.md):

- tensor-parallel weights (``tensor_model_parallel`` with ``partition_dim``):
  chunk ``tp_rank`` of ``tp`` along that dim (embedding and LM head by
  vocabulary rows, QKV by heads, the attention projection by input columns);
- experts: ``local_experts.j`` on expert-parallel rank ``e`` is global expert
  ``e * E/ep + j``, whole (expert tensor parallelism is 1);
- everything else whole (norms, router, the critic's replicated value head).

A tensor that stacks several sections along its split dim (GatedDeltaNet's ``in_proj`` is
``[q; k; v; z; b; a]``, its ``conv1d`` ``[q; k; v]``; ``t1_sections`` on the parameter, set by
``rl.model.qwen35``) is split section by section: rank r holds ``[q_r; k_r; ...]``, the layout
megatron's GatedDeltaNet computes with.

The rules read the live parameters' own megatron attributes, so a layout the
model builds is a layout this module can shard and gather.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

import torch

from rl.errors import CheckpointError

_EXPERT = re.compile(r"^(?P<pre>.*\.mlp\.experts\.local_experts\.)(?P<j>\d+)(?P<post>\..*)$")


@dataclass(frozen=True)
class Placement:
    """Where one local tensor sits in the full tensor of ``full_name``."""

    full_name: str
    dim: int | None      # split dim (None: whole)
    index: int = 0       # this rank's chunk
    count: int = 1       # chunks along dim
    sections: tuple[int, ...] = ()  # sizes of stacked sections, each split on its own (empty: one block)

    def cut(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the full tensor."""
        blocks = torch.split(full, list(self.sections), dim=self.dim) if self.sections else (full,)
        for block in blocks:
            if block.shape[self.dim] % self.count:
                raise CheckpointError(f"{self.full_name} {tuple(full.shape)} does not split in {self.count} along "
                                      f"dim {self.dim} (sections {self.sections})", path=self.full_name)
        return torch.cat([b.chunk(self.count, dim=self.dim)[self.index] for b in blocks], dim=self.dim)

    def join(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """The full tensor from every rank's piece (``parts[i]`` from rank i)."""
        if not self.sections:
            return torch.cat(parts, dim=self.dim)
        local = [s // self.count for s in self.sections]
        split = [torch.split(p, local, dim=self.dim) for p in parts]
        return torch.cat([torch.cat([split[r][k] for r in range(self.count)], dim=self.dim)
                          for k in range(len(local))], dim=self.dim)


def is_expert(name: str) -> bool:
    return _EXPERT.match(name) is not None


def placements(model, *, tp_rank: int, tp: int, ep_rank: int, ep: int, num_experts: int) -> dict[str, Placement]:
    """Placement of every tensor of ``weights_state_dict(model)`` on this rank."""
    params = dict(model.named_parameters())
    out: dict[str, Placement] = {}
    for name, tensor in model.state_dict().items():
        if not isinstance(tensor, torch.Tensor):
            continue
        match = _EXPERT.match(name)
        if match:
            per_rank = num_experts // ep
            full = f"{match['pre']}{ep_rank * per_rank + int(match['j'])}{match['post']}"
            out[name] = Placement(full, None)
            continue
        p = params.get(name)
        if p is not None and getattr(p, "tensor_model_parallel", False) and tp > 1:
            out[name] = Placement(name, int(p.partition_dim), tp_rank, tp, tuple(getattr(p, "t1_sections", ())))
        else:
            out[name] = Placement(name, None)
    return out


def local_from_full(full: Mapping[str, torch.Tensor], where: dict[str, Placement]) -> dict[str, torch.Tensor]:
    """This rank's state from a full state; a missing name or a shape that does not split is an error."""
    missing = sorted({pl.full_name for pl in where.values()} - set(full))
    if missing:
        raise CheckpointError(f"full state lacks {len(missing)} tensor(s) this layout needs (first: {missing[:3]}); "
                              "it was saved for another model shape", mismatched=missing[:10])
    out = {}
    for name, pl in where.items():
        t = full[pl.full_name]
        out[name] = (t if pl.dim is None else pl.cut(t)).detach().clone()
    return out


def assemble(pieces: list[tuple[dict[str, Placement], dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    """The full state from every rank's (placements, local state); duplicates must agree in shape."""
    chunks: dict[str, dict[int, torch.Tensor]] = {}
    whole: dict[str, torch.Tensor] = {}
    dims: dict[str, Placement] = {}
    for where, state in pieces:
        for name, pl in where.items():
            if pl.dim is None:
                whole.setdefault(pl.full_name, state[name])
            else:
                chunks.setdefault(pl.full_name, {})[pl.index] = state[name]
                dims[pl.full_name] = pl
    for name, parts in chunks.items():
        pl = dims[name]
        if sorted(parts) != list(range(pl.count)):
            raise CheckpointError(f"{name}: shards {sorted(parts)} of {pl.count} present; a rank's shard is missing",
                                  path=name)
        whole[name] = pl.join([parts[i] for i in range(pl.count)])
    return whole
