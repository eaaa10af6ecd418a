"""The trainer as one Ray actor per rank, in a placement group (``trainer.parallel`` world > 1).

Layout: ``dp * tp * pp`` ranks, one bundle each (one CPU here; one GPU per
bundle when the cluster has GPUs). Start-up: the actors are created, rank 0
names the rendezvous address (its node IP and a free port), then every rank
:meth:`TrainerRankHost.join`s: layout-free initial weights in a world of 1,
its process group through ``t1ops.guards.dist`` (explicit timeout), megatron's
parallel state, its :class:`~rl.trainer.ranks.RankTrainer` shard of actor and
critic, its progress beacon and its collective watch (``t1ops.guards.rank_watch``).

The coordinator talks to the ranks through :class:`RankGroup`: ``group.train.remote(results)``
sends the call to every rank (the arguments are put in the object store once)
and returns one reference that resolves to rank 0's answer when all ranks are
done (any rank's error is raised), so the step loop is the same for 1 rank or N.
Publishing gathers the full actor once per step (a collective); rank 0 keeps it
for the weight sync. Every ``save_every`` steps (and at the last step) rank 0
writes the role-separated, checksummed checkpoint and both roles are also saved
sharded: one file per rank under one checksummed manifest
(``t1ops.guards.sharded_checkpoints``), loadable at any layout (docs/parallelism.md).
"""
from __future__ import annotations

import dataclasses
import io
import os
import shutil
import time
from pathlib import Path

import ray
import torch
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rl.errors import DataContractError
from rl.model import ModelSpec
from rl.trainer.packing import FILLER
from rl.trainer.ranks import Layout, RankTrainer, full_initial_states
from rl.vocab import CompactVocab
from t1ops import telemetry
from t1ops.campaign.credit import CreditBatch
from t1ops.campaign.dataplane import batch_rows, fetch_shard, shard_trials
from t1ops.campaign.rank_combine import Combiner
from t1ops.campaign.resume import load_trainer_state, save_trainer_state, trainer_state
from t1ops.campaign.retention import Retention, disk_bytes
from t1ops.campaign.roles import CheckpointReport, RankInfo, TrainReport
from t1ops.campaign.trainer_host import TrainerHost, load_rank_state, rank_state, require_credit, resumed
from t1ops.campaign.trainer_rank import join_world
from t1ops.config import CampaignConfig, CheckpointsConfig, GuardsConfig, TrainerConfig
from t1ops.errors import ConfigError
from t1ops.guards.checkpoints import CheckpointManager, list_steps, step_dir_name
from t1ops.guards.rank_watch import ProgressBeacon, RankProcess, RankWatch, collective_watch
from t1ops.guards.rendezvous import plan_rendezvous
from t1ops.guards.sharded_checkpoints import save_sharded

PG_READY_TIMEOUT_S = 120.0


class TrainerRankHost(TrainerHost):
    """One trainer rank (a Ray actor). Warm start, batch assembly and ``train`` are TrainerHost's."""

    def __init__(self, *, rank: int, layout: Layout, spec: dict, settings: TrainerConfig, vocab_path: str,
                 ckpt_base: str, seed: int, run_dir: str, guards: GuardsConfig, telemetry_cfg: dict | None = None,
                 temperature: float = 1.0, num_threads: int = 1, retention: CheckpointsConfig | None = None) -> None:
        torch.set_num_threads(num_threads)
        self.rank, self.layout, self.run_dir = rank, layout, Path(run_dir)
        telemetry.setup(run_dir, role=f"trainer-rank{rank}", **(telemetry_cfg or {}))
        self.guards = guards
        self.vocab = CompactVocab.load(vocab_path)
        self.spec = ModelSpec(**{**spec, "vocab_size": self.vocab.size})
        self.settings = settings
        # rank 0 writes the checkpoints; every rank refuses a bad layout before any model exists
        self.ckpt = CheckpointManager.from_base(ckpt_base, save_every=self.settings.save_every)
        self.seed, self.temperature = seed, temperature
        self.published: dict[int, dict[str, torch.Tensor]] = {}  # version -> this rank's behaviour shard
        self.full_published: dict[int, dict[str, torch.Tensor]] = {}  # rank 0: version -> full actor
        self.trainer: RankTrainer | None = None

        self.retention = Retention(self.ckpt.actor_dir.parent, needs_critic=self.settings.mode == "ppo",
                                   **(retention or CheckpointsConfig(keep_last=None)).model_dump())
        self.last_report = CheckpointReport()
        self._fetched: set[int] | None = None  # trials this rank fetched in full this step (fetch_shard)

    def address(self) -> str:
        """Rank 0: the rendezvous on its own node, one fresh port per attempt (group-init-race:
        ``t1ops.guards.rendezvous``, bounded by ``guards.field.group_init_timeout_s``)."""
        return plan_rendezvous(ray.util.get_node_ip_address(), self.guards.field)

    def join(self, init_method: str) -> int:
        """Initial weights (world of 1), then the real world and megatron's groups; returns the pid."""
        actor, critic = full_initial_states(self.spec, self.settings, self.seed, self.vocab.unk_id)
        timeout = join_world(self.rank, self.layout.world_size, init_method, self.layout, guards=self.guards,
                             seed=self.seed)
        self.beacon = ProgressBeacon(self.run_dir / "ranks" / f"rank{self.rank}.progress")
        self._collective_watch = collective_watch(timeout, self.guards)
        self.trainer = RankTrainer(self.spec, self.settings, self.layout, full_actor=actor, full_critic=critic,
                                   unk_id=self.vocab.unk_id, seed=self.seed, temperature=self.temperature,
                                   on_micro_batch=self.beacon, watch=self._collective_watch)
        telemetry.event("trainer.rank_joined", rank=self.rank, world_size=self.layout.world_size,
                        tp_rank=self.trainer.tp_rank, dp_rank=self.trainer.dp_rank, ep_rank=self.trainer.ep_rank,
                        timeout_s=timeout.total_seconds())
        return os.getpid()

    def train(self, credit: CreditBatch, behaviour: str = "snapshot") -> TrainReport:
        """This rank fetches only its data-parallel shard's trajectories (``dataplane.fetch_shard``:
        the light arrays of all, the full chunks of the trials its rows come from), then steps."""
        credit = require_credit(credit, "TrainerRankHost.train")
        if credit.no_signal is not None:  # every rank gets the same credit: all skip together
            return TrainReport(skipped=credit.no_signal)
        t0, mbs0 = time.perf_counter(), self.trainer.micro_batches_done
        dp, dp_rank = self.layout.dp, self.trainer.dp_rank
        trials, fetched = fetch_shard(list(credit.trials), lambda light: shard_trials(light, dp, dp_rank))
        self._fetched = set(fetched["fetched"]) if fetched["staged"] else None
        report = self._step(credit.with_trials(trials), behaviour)
        info = RankInfo(rank=self.rank, dp_rank=dp_rank, train_s=round(time.perf_counter() - t0, 3),
                        micro_batches=self.trainer.micro_batches_done - mbs0, staged=fetched["staged"],
                        fetched=list(fetched["fetched"]), fetched_bytes=fetched["fetched_bytes"],
                        light_bytes=fetched["light_bytes"])
        telemetry.gauge("trainer.rank_fetched_bytes", info.fetched_bytes, rank=self.rank)
        telemetry.gauge("trainer.rank_train_s", info.train_s, rank=self.rank)
        telemetry.gauge("trainer.rank_micro_batches", info.micro_batches, rank=self.rank)
        telemetry.event("trainer.rank_step", step=report.stats.step, **dataclasses.asdict(info))
        return dataclasses.replace(report, rank_info=info)

    def build_batch(self, credit: CreditBatch):
        """The batch as every rank builds it; a row this rank trains must come from a trial it
        fetched in full (else its forward would read placeholder routing rows): a named error."""
        batch = super().build_batch(credit)
        if self._fetched is not None:
            trial_of = [i for i, _ in batch_rows(list(credit.trials))]
            rows = {r for mb in self.trainer.plan(batch) for r in mb.rows if r != FILLER}
            stray = sorted({trial_of[r] for r in rows} - self._fetched)
            if stray:
                raise DataContractError(f"trainer rank {self.rank} (dp rank {self.trainer.dp_rank}) trains rows of "
                                        f"trials {stray[:8]} it did not fetch; dataplane.shard_trials must split "
                                        "as RankTrainer.plan does", rank=self.rank)
        return batch

    def _prune_shards(self) -> list[str]:
        """The retention policy (``[checkpoints]``) applied to the sharded steps too (rank 0)."""
        base = self.ckpt.actor_dir.parent
        return [d for role in ("actor", "critic") for d in _prune(base / f"{role}-shards", self.retention.keep)]

    def publish(self, version: int, final: bool = False) -> str | None:
        """Gather the full actor once (a collective on every rank): rank 0 keeps it for the weight
        sender. At a resume point (``is_resume_point``: every save_every steps and the last step):
        both roles sharded per rank, and rank 0 saves the full actor and critic and every rank's
        optimizer and RNG state (``trainer_state``, the same format a 1-rank trainer writes).
        Every rank keeps its shard as the behaviour snapshot. Rank 0 returns the newest actor
        checkpoint directory."""
        actor = self.trainer.full_state("actor")  # the engines' weights: gathered once per step
        resume_point = self.is_resume_point(version, final)
        critic = ranks = None
        if resume_point:
            with self._collective_watch("sharded checkpoint save"):
                for role in ("actor", "critic") if self.trainer.critic is not None else ("actor",):
                    save_sharded(self.ckpt.actor_dir.parent, role, version, self.trainer)
            critic = self.trainer.full_state("critic") if self.trainer.critic is not None else None
            ranks = [None] * self.layout.world_size if self.rank == 0 else None
            with self._collective_watch("trainer state gather"):  # bytes: tensors do not survive gather_object
                torch.distributed.gather_object(_to_bytes(rank_state(self.trainer)), ranks, dst=0)
            ranks = None if ranks is None else [torch.load(io.BytesIO(b), weights_only=True) for b in ranks]
        path = None
        if self.rank == 0:
            if resume_point:
                self.ckpt.save("actor", version, actor)
                if critic is not None:
                    self.ckpt.save("critic", version, critic)
                save_trainer_state(self.retention.base, version, trainer_state(self.trainer, version, ranks))
            deleted = self.retention.apply() + self._prune_shards()
            self.last_report = CheckpointReport(disk_bytes(self.retention.base), len(deleted),
                                                self.retention.resume_point())
            path = self.newest_actor_checkpoint()
        self.published[version] = self.trainer.snapshot_behaviour()
        if self.rank == 0:  # the full weights the weight sender exports or broadcasts (rl.weights.sender)
            self.full_published[version] = actor
        for old in sorted(self.published)[:-2]:
            del self.published[old]
        for old in sorted(self.full_published)[:-2]:
            del self.full_published[old]
        return path

    def _published_weights(self, version: str):
        """Rank 0 is the weight sender of a multi-rank trainer: the full actor it gathered at publish."""
        if self.rank != 0:
            raise RuntimeError(f"rank {self.rank} holds a shard; the weight sender is rank 0")
        return self.full_published[int(version)], self.spec


    def resume(self, step: int) -> dict:
        """Every rank: the full (layout-free) weights of ``step``, its own optimizer and RNG state."""
        actor = self.ckpt.load("actor", step)
        critic = self.ckpt.load("critic", step) if self.trainer.critic is not None else None
        state = load_trainer_state(self.retention.base, step)
        self.trainer.load_full(actor=actor, critic=critic, step=int(state["step"]))
        load_rank_state(self.trainer, state, rank=self.rank, world_size=self.layout.world_size)
        self.published = {step: self.trainer.snapshot_behaviour()}
        self.full_published = {step: dict(actor)} if self.rank == 0 else {}
        return resumed(self, step, state, critic is not None)


def _to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _prune(role_dir: Path, keep) -> list[str]:
    """Sharded steps of one role outside the retention policy's ``keep`` set, deleted."""
    steps = list_steps(role_dir) if role_dir.is_dir() else []
    gone = sorted(set(steps) - keep(steps, None))
    for step in gone:
        shutil.rmtree(role_dir / step_dir_name(step))
    return [f"{role_dir.name}/{step_dir_name(step)}" for step in gone]


class _Broadcast:
    def __init__(self, group: "RankGroup", name: str) -> None:
        self.group, self.name = group, name

    def remote(self, *args, **kwargs):
        args = [ray.put(a) for a in args]  # once in the object store, whatever the rank count
        refs = [getattr(a, self.name).remote(*args, **kwargs) for a in self.group.actors]
        return self.group.combiner.combine.remote(self.name, *refs)


class RankGroup:
    """Coordinator-side handle: ``group.<method>.remote(...)`` runs on every rank (see module docstring)."""

    def __init__(self, actors: list, placement) -> None:
        self.actors, self.placement = actors, placement

        self.combiner = ray.remote(Combiner).options(num_cpus=0).remote()

    def __getattr__(self, name: str) -> _Broadcast:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Broadcast(self, name)


def start_ranks(cfg: CampaignConfig, run, spec: dict) -> tuple[RankGroup, RankWatch]:
    """Placement group, one actor per rank, rendezvous; returns the group and the coordinator's watch."""
    p = cfg.trainer.parallel
    layout = p  # a ParallelConfig is the rank trainer's Layout
    gpus = ray.cluster_resources().get("GPU", 0) >= layout.world_size and p.backend != "gloo"
    bundle = {"CPU": 1, "GPU": 1} if gpus else {"CPU": 1}
    pg = placement_group([dict(bundle) for _ in range(layout.world_size)], strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=PG_READY_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise ConfigError(f"the Ray cluster cannot place {layout.world_size} trainer ranks of {bundle} each "
                          f"(cluster: {ray.cluster_resources()}); lower trainer.parallel or raise run.num_cpus",
                          key="trainer.parallel") from None
    actors = [ray.remote(TrainerRankHost).options(
        num_cpus=1, num_gpus=1 if gpus else 0,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r)).remote(
        rank=r, layout=layout, spec=spec, settings=cfg.trainer, vocab_path=str(run.vocab),
        ckpt_base=str(run.checkpoints), seed=cfg.run.seed, run_dir=str(run.path), guards=cfg.guards,
        telemetry_cfg={"otlp_endpoint": cfg.telemetry.otlp_endpoint,
                       "export_interval_s": cfg.telemetry.export_interval_s},
        temperature=cfg.rollout.temperature, retention=cfg.checkpoints)
        for r in range(layout.world_size)]
    init_method = ray.get(actors[0].address.remote())
    pids = ray.get([a.join.remote(init_method) for a in actors])
    procs = {}
    for r, (actor, pid) in enumerate(zip(actors, pids)):
        stack_path = run.path / f"trainer-rank{r}-stacks.txt"
        ray.get(actor.install_stack_dump.remote(str(stack_path)))
        procs[r] = RankProcess(pid, run.path / "ranks" / f"rank{r}.progress", stack_path)
    return RankGroup(actors, pg), RankWatch(cfg.guards, procs)
