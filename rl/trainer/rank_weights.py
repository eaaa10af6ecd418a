"""A rank's weights: loading full or sharded states into its shard, gathering and handing out its piece,
and the behaviour policy it keeps (the weights half of :class:`~rl.trainer.ranks.RankTrainer`).

Weights leave and enter a rank under the whole model's names (``rl.trainer.pipeline.global_shard``),
cut by the placement rules of ``rl.trainer.shard``; checkpoints by shard are
``t1ops.guards.sharded_checkpoints`` (docs/parallelism.md).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import torch
import torch.distributed as dist

from rl import model as rmodel
from rl.errors import InputError
from rl.trainer import pipeline as pl
from rl.trainer.shard import assemble, local_from_full, placements
from rl.trainer.step import copy_state


class RankWeights:
    """The weights methods of a rank trainer; the trainer sets ``actor``, ``critic``, ``spec``,
    ``layout``, ``tp_rank``, ``ep_rank``, ``step``, ``_behaviour`` and ``_watch``."""

    def _placements(self, model):
        return placements(model, tp_rank=self.tp_rank, tp=self.layout.tp, ep_rank=self.ep_rank,
                          ep=self.layout.ep, num_experts=self.spec.num_experts)

    def _load(self, model, full: Mapping[str, torch.Tensor]) -> None:
        """This rank's pieces of ``full``, asked for tensor by tensor (a lazy checkpoint reader assembles
        each on demand: the rank never holds more than its shard and one full tensor)."""
        first = model.t1_layers[0]
        where = {n: dataclasses.replace(p, full_name=pl.global_name(p.full_name, first))
                 for n, p in self._placements(model).items()}
        rmodel.load_state(model, local_from_full(full, where), source="full state")

    def load_role(self, role: str, full: Mapping[str, torch.Tensor],
                  own: tuple[Mapping, Mapping[str, torch.Tensor]] | None = None) -> str:
        """Load ``role`` from a checkpoint: ``own`` (placements, tensors under the whole model's names: this
        rank's file of a checkpoint saved at this layout) when it is exactly this rank's shard, else the
        pieces cut from ``full`` (re-sharding from another layout). Returns which ("own shard" / "re-sharded")."""
        model = self.actor if role == "actor" else self.critic
        if model is None:
            raise InputError(f"this trainer has no {role} to load (GRPO mode has no critic)", argument="role")
        first = model.t1_layers[0]
        self._behaviour = None
        if own is not None and dict(own[0]) == pl.global_shard(self._placements(model), {}, model)[0]:
            local = {n: own[1][pl.global_name(n, first)].clone() for n in self._placements(model)}
            rmodel.load_state(model, local, source="own shard")
            return "own shard"
        self._load(model, full)
        return "re-sharded"

    def _piece(self, model):
        """(placements, tensors) of this rank's part of ``model`` under the whole model's names."""
        return pl.global_shard(self._placements(model), rmodel.weights_state_dict(model), model)

    def full_state(self, role: str) -> dict[str, torch.Tensor] | None:
        """The whole model of ``role`` gathered from every rank (a collective); the full state on rank 0. Tests
        and benchmarks compare with it; the campaign never gathers (docs/weights.md, "Every rank sends its shard")."""
        model = self.actor if role == "actor" else self.critic
        piece = self._piece(model)
        pieces = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        with self._watch(f"full-state gather ({role})"):
            dist.gather_object(piece, pieces, dst=0)
        return assemble(pieces) if pieces is not None else None

    def shard(self, role: str):
        """(placements, tensors) of this rank's part of ``role``: what a sharded checkpoint stores."""
        model = self.actor if role == "actor" else self.critic
        if model is None:
            raise InputError(f"this trainer has no {role} (GRPO mode has no critic)", argument="role")
        return self._piece(model)

    def load_full(self, *, actor: Mapping[str, torch.Tensor] | None = None,
                  critic: Mapping[str, torch.Tensor] | None = None, step: int | None = None) -> None:
        """Load full (any-layout) weights; this rank keeps its shard."""
        if actor is not None:
            self._load(self.actor, actor)
        if critic is not None:
            if self.critic is None:
                raise InputError("GRPO mode has no critic to load", argument="critic")
            self._load(self.critic, critic)
        if step is not None:
            self.step = int(step)
        self._behaviour = None

    def snapshot_behaviour(self) -> dict[str, torch.Tensor]:
        """This rank's shard of the actor as it is now (the policy the engines sample with next),
        kept as the behaviour policy and returned (a host keeps one per published version)."""
        self._behaviour = copy_state(self.actor.state_dict())
        return self._behaviour

    def set_behaviour(self, local_state: Mapping[str, torch.Tensor] | None) -> None:
        """Use ``local_state`` (this rank's shard of the weights that sampled the next batch) as the
        behaviour policy; None means the current weights (a synchronous loop)."""
        self._behaviour = None if local_state is None else copy_state(local_state)
