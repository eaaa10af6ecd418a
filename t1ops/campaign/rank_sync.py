"""The weight sync's view of one trainer rank: what it holds, who sends what, and how rank 0 reaches
its peers (docs/weights.md, "Every rank sends its shard").

Mixed into :class:`~t1ops.campaign.trainer_host.TrainerHost` as its :class:`rl.weights.sender.WeightSender`:
each rank's ``published`` versions (its behaviour snapshots) are what it sends; the plan
(``rl.weights.shard_plan``) is built once from every rank's holdings (names and shapes, gathered over
the trainer's own process group); rank 0, which the coordinator's barrier calls, runs each
``*_here`` step on every rank at once through the peers' Ray actor handles (:meth:`set_weight_peers`),
its own part on a thread. A world of 1 has no peers: it owns every tensor.
"""
from __future__ import annotations

import contextlib

import ray
import torch

from rl.hf import layout
from rl.trainer import pipeline as pl
from rl.weights.sender import WeightSender, run_each
from rl.weights.shard_plan import Held, plan_sends


class RankWeightSync(WeightSender):
    """The host sets ``trainer``, ``spec``, ``rank``, ``world_size``, ``published``, ``_collective_watch``,
    ``_ws_rank``, ``_weight_peers`` (``[]``) and ``_plan`` (None)."""

    def _published_weights(self, version: str):
        """This rank's shard of the actor published as ``version``, under the whole model's names."""
        return pl.global_names(self.published[int(version)], self.trainer.actor), self.spec

    def weight_holdings(self) -> dict[str, Held]:
        """What this rank holds of the actor: placements, shapes and dtypes under the whole model's names."""
        where, state = self.trainer.shard("actor")
        return {n: Held(where[n], tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in state.items()}

    def build_weight_plan(self) -> None:
        """Every rank at once, once its trainer exists (a collective): every rank's holdings gathered
        (names and shapes only) and the same plan made on each (``rl.weights.shard_plan``)."""
        mine = self.weight_holdings()
        holdings = [mine]
        if self.world_size > 1:
            holdings = [None] * self.world_size
            with self._collective_watch("weight-sync plan"):
                torch.distributed.all_gather_object(holdings, mine)
        self._plan = plan_sends(holdings, [u.mcore for u in layout.units(self.spec)])

    def weight_plan(self, version: str = "0"):
        """Who sends what; the same on every rank and for every version (the layout does not change)."""
        if self._plan is None:
            if self.world_size > 1:  # a collective: it cannot start on one rank alone
                raise RuntimeError(f"rank {self.rank}: the weight-sync plan is built at join (build_weight_plan)")
            self.build_weight_plan()
        return self._plan

    def _walk(self, version: str, states: list, only=lambda s: True):
        """The sync's walk (its point-to-point pieces) under the collective watch: a peer that never sends
        its piece is reported slow, then the trainer group's timeout ends the wait."""
        with self._collective_watch("weight sync (tensor-parallel pieces)"):
            yield from super()._walk(version, states, only)

    def set_weight_peers(self, actors: list) -> int:
        """Rank 0: every rank's actor handle, in rank order (the weight sync's fan-out); returns the count."""
        self._weight_peers = list(actors)
        return len(actors)

    def _each_rank(self, method: str, *args) -> list:
        if not self._weight_peers:
            return super()._each_rank(method, *args)
        calls = [lambda a=a: ray.get(getattr(a, method).remote(*args)) for a in self._weight_peers[1:]]
        return run_each(lambda: getattr(self, method)(*args), calls)

    def _on_rank(self, rank: int, method: str, *args):
        if rank == self.rank or not self._weight_peers:
            return super()._on_rank(rank, method, *args)
        return ray.get(getattr(self._weight_peers[rank], method).remote(*args))


class RankSender(RankWeightSync):
    """One rank's weight sender without Ray or a campaign (benchmarks, the rank test harness): every rank
    of a real world runs its own ``*_here`` parts at once; ``published[version]`` is its shard of ``rt``'s
    actor now. Builds the plan, so every rank must construct it together (a collective)."""

    def __init__(self, rt, spec, rank: int, world: int, version: int = 1, **sender_kw) -> None:
        self.trainer, self.spec, self.rank, self.world_size = rt, spec, rank, world
        self.published = {version: rt.snapshot_behaviour()}
        self._collective_watch = lambda what: contextlib.nullcontext()
        self._ws_rank, self._weight_peers, self._plan = rank, [], None
        self.configure_weight_sender(**sender_kw)
        self.build_weight_plan()
