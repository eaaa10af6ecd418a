"""The trainer's ranks as Ray actors, and the coordinator's typed handle on them (docs/parallelism.md).

Every world size takes one path (:func:`start_trainer`): ``dp * tp * pp`` actors of the one
trainer class, :class:`~t1ops.campaign.trainer_host.TrainerHost`. A world of 1 is a group of
one: its actor builds its trainer at once in its own process (no placement group, no
rendezvous), and the coordinator's watchdog watches it. A larger world gets a placement group,
one bundle per rank (one CPU here; one GPU per bundle when the cluster has GPUs); rank 0 names
the rendezvous address (its node IP and a free port), then every rank joins (explicit
timeouts, ``t1ops.guards.dist``) and the coordinator's :class:`~t1ops.guards.rank_watch.RankWatch`
watches them.

The coordinator talks to the ranks through :class:`TrainerGroup`, whose methods name every call
the step loop makes and say what each returns: each sends the call to every rank (arguments put
in the object store once) and returns one reference that resolves to rank 0's answer when all
ranks are done (any rank's error is raised; ``t1ops.campaign.rank_combine``), so the step loop
is the same for 1 rank or N. There is no attribute broadcast: a call the handle does not name
does not exist.
"""
from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from t1ops.campaign.credit import CreditBatch
from t1ops.campaign.rank_combine import Combiner
from t1ops.campaign.trainer_host import TrainerHost
from t1ops.config import CampaignConfig
from t1ops.errors import ConfigError
from t1ops.guards.rank_watch import RankProcess, RankWatch

PG_READY_TIMEOUT_S = 120.0


class TrainerGroup:
    """Coordinator-side handle on the trainer's ranks (see the module docstring). Each method returns
    a Ray object reference to rank 0's answer, of the type its docstring names."""

    def __init__(self, actors: list, placement: Any = None) -> None:
        self.actors, self.placement = actors, placement
        self.combiner = ray.remote(Combiner).options(num_cpus=0).remote() if len(actors) > 1 else None

    @property
    def sender(self):
        """Rank 0's actor: the coordinator's barrier calls it; it runs every rank's part of the weight sync."""
        return self.actors[0]

    def _all(self, name: str, *args):
        if self.combiner is None:  # a group of one
            return getattr(self.actors[0], name).remote(*args)
        args = tuple(ray.put(a) for a in args)  # once in the object store, whatever the rank count
        refs = [getattr(a, name).remote(*args) for a in self.actors]
        return self.combiner.combine.remote(name, *refs)

    def train(self, credit: CreditBatch, behaviour: str, step: int | None = None):
        """-> ``roles.TrainReport`` (every rank's ``RankInfo`` in ``ranks`` when there are several);
        ``step``: a retried call for an applied step trains nothing (retried-train-step)."""
        return self._all("train", credit, behaviour, step)

    def publish(self, version: int, final: bool = False):
        """-> the newest actor checkpoint directory (``str | None``)."""
        return self._all("publish", version, final)

    def warm_start(self, examples: list[tuple[str, str]], num_steps: int):
        """-> the supervised loss curve (``list[float]``)."""
        return self._all("warm_start", examples, num_steps)

    def resume(self, step: int):
        """-> what was loaded (``dict``: ``trainer_host.resumed``)."""
        return self._all("resume", step)

    def configure_weight_sender(self, **kw):
        """-> None, on every rank (each sends its own shard: ``rl.weights.sender``); submitted before rank 0's
        ``configure_weight_push`` (calls on one actor run in order)."""
        return [a.configure_weight_sender.remote(**kw) for a in self.actors]

    def checkpoint_report(self):
        """-> ``roles.CheckpointReport``."""
        return self.sender.checkpoint_report.remote()

    def num_params(self):
        """-> (actor, critic) parameter counts of rank 0's shard, for the host-memory projection."""
        return self.sender.num_params.remote()


def start_trainer(cfg: CampaignConfig, run, spec: dict) -> tuple[TrainerGroup, RankWatch | None]:
    """The trainer's ranks, any world size; returns the group and, for a world > 1, the coordinator's
    rank watch (a world of 1 is watched by the watchdog: ``TrainerHost.install_stack_dump``)."""
    world = cfg.trainer.parallel.world_size
    kw = dict(spec=spec, settings=cfg.trainer, vocab_path=str(run.vocab), ckpt_base=str(run.checkpoints),
              seed=cfg.run.seed, run_dir=str(run.path), guards=cfg.guards, temperature=cfg.rollout.temperature,
              retention=cfg.checkpoints, telemetry_cfg={"otlp_endpoint": cfg.telemetry.otlp_endpoint,
                                                        "export_interval_s": cfg.telemetry.export_interval_s},
              model_path=cfg.model.path)
    if world == 1:  # a group of one: no placement group, no rendezvous
        return TrainerGroup([ray.remote(TrainerHost).options(num_cpus=0).remote(rank=0, **kw)]), None
    p = cfg.trainer.parallel
    gpus = ray.cluster_resources().get("GPU", 0) >= world and p.backend != "gloo"
    bundle = {"CPU": 1, "GPU": 1} if gpus else {"CPU": 1}
    pg = placement_group([dict(bundle) for _ in range(world)], strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=PG_READY_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise ConfigError(f"the Ray cluster cannot place {world} trainer ranks of {bundle} each "
                          f"(cluster: {ray.cluster_resources()}); lower trainer.parallel or raise run.num_cpus",
                          key="trainer.parallel") from None
    actors = [ray.remote(TrainerHost).options(
        num_cpus=1, num_gpus=1 if gpus else 0,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r)).remote(rank=r, **kw)
        for r in range(world)]
    init_method = ray.get(actors[0].address.remote())
    pids = ray.get([a.join.remote(init_method) for a in actors])
    procs = {}
    for r, (actor, pid) in enumerate(zip(actors, pids)):
        stack_path = run.path / f"trainer-rank{r}-stacks.txt"
        ray.get(actor.install_stack_dump.remote(str(stack_path)))
        procs[r] = RankProcess(pid, run.path / "ranks" / f"rank{r}.progress", stack_path)
    ray.get(actors[0].set_weight_peers.remote(actors))  # rank 0 drives every rank's part of the weight sync
    return TrainerGroup(actors, pg), RankWatch(cfg.guards, procs)
