"""The trainer role at every world size: actor + critic on megatron-core, checkpoints, the step.

One class, :class:`TrainerHost`, one Ray actor per rank; a world of 1 is a group of one (docs/
parallelism.md: a degree of 1 means "off", never a second code path). It executes the credit
stage's batch (``t1ops.campaign.credit.CreditBatch``: it fetches the trainable trials' chunks,
builds a :class:`~rl.trainer.batch.TrainBatch` in the model's compact ids and steps, deciding
nothing), and publishes the actor for the engines every step (the weight sync sends that
snapshot; rank 0 is the weight sender).

Start-up: a world of 1 builds its trainer at once, in a one-process megatron world
(``rl.megatron_cpu.init_single_process``). A larger world's ranks are created first; rank 0
names the rendezvous (:meth:`TrainerHost.address`) and every rank :meth:`TrainerHost.join`\s:
layout-free initial weights in a world of 1, its process group through ``t1ops.guards.dist``
(explicit timeout), megatron's parallel state, its :class:`~rl.trainer.ranks.RankTrainer`
shard, its progress beacon and collective watch (``t1ops.guards.rank_watch``). Each rank
fetches only its data-parallel shard's trajectories (``dataplane.fetch_shard``).

The resumable checkpoint (both roles, role-separated and checksummed, and the trainer state:
every rank's optimizer and RNG) is written every ``save_every`` steps and at the run's last
step, not on every publish. A world of 1 writes each role whole (its shard is the full state); a
larger world saves by shard: every rank writes its own slice of each role, one file per rank under
one checksummed manifest in the role's directory (``t1ops.guards.sharded_checkpoints``), nothing
gathered; a resume at the same layout loads each rank's own file, another layout re-shards tensor
by tensor. Nothing gathers the model for the weight sync either: every rank keeps its own shard of
each published version and sends (or exports) the tensors the plan gives it (``rl.weights.shard_plan``;
docs/weights.md, "Every rank sends its shard"); rank 0 only drives the engines' side, and reaches its
peers through the actor handles the group gives it (:meth:`TrainerHost.set_weight_peers`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import time
from pathlib import Path

import numpy as np
import ray
import torch

from rl.agent.loop import sft_example
from rl.chat import ChatRenderer
from rl.errors import ConfigError, DataContractError
from rl.hf.checkpoint import is_hf_dir
from rl.megatron_cpu import init_single_process
from rl.model import ModelSpec, weights_state_dict
from rl.trainer.batch import TrainBatch
from rl.trainer.optim import build_optimizer
from rl.trainer.packing import FILLER
from rl.trainer.ranks import Layout, RankTrainer, full_initial_states
from rl.trainer.trainer import Trainer
from rl.vocab import CompactVocab
from t1ops import telemetry
from t1ops.campaign.credit import CreditBatch
from t1ops.campaign.pretrained import pretrained_states
from t1ops.campaign.dataplane import batch_rows, fetch, fetch_shard, shard_trials
from t1ops.campaign.resume import (rank_state, restore_rank_state, resumed, save_rank_states, save_trainer_state,
                                   trainer_state)
from t1ops.campaign.retention import Retention, disk_bytes
from t1ops.campaign.roles import CheckpointReport, RankInfo, TrainReport
from t1ops.campaign.trainer_rank import join_world
from t1ops.campaign.rank_sync import RankWeightSync
from t1ops.campaign.weight_push import WeightPush
from t1ops.config import CheckpointsConfig, GuardsConfig, TrainerConfig
from t1ops.guards import dist as dist_guard
from t1ops.guards.checkpoints import CheckpointManager, list_steps, step_dir_name
from t1ops.guards.rank_watch import ProgressBeacon, collective_watch
from t1ops.guards.rendezvous import plan_rendezvous
from t1ops.guards.sharded_checkpoints import CheckpointReader, load_into, save_sharded
from t1ops.guards.step_once import StepLedger
from t1ops.guards.watchdog import install_stack_dump


class TrainerHost(RankWeightSync, WeightPush):
    """One trainer rank (a Ray actor); rank 0 of a world of 1 is the whole trainer (module docstring)."""

    def __init__(self, *, spec: dict, settings: TrainerConfig, vocab_path: str, ckpt_base: str, seed: int,
                 run_dir: str | None = None, rank: int = 0, layout: Layout | None = None,
                 guards: GuardsConfig | None = None, telemetry_cfg: dict | None = None, temperature: float = 1.0,
                 retention: CheckpointsConfig | None = None, num_threads: int = 1,
                 model_path: str | None = None) -> None:
        """``model_path``: the ``[model] path`` checkpoint both roles start from (docs/model.md)."""
        torch.set_num_threads(num_threads)
        self.model_path = model_path
        self.rank, self.layout = rank, layout or settings.parallel
        self.world_size = self.layout.world_size
        self.guards, self.run_dir = guards or GuardsConfig(), None if run_dir is None else Path(run_dir)
        if run_dir is not None:
            role = "trainer" if self.world_size == 1 else f"trainer-rank{rank}"
            telemetry.setup(run_dir, role=role, **(telemetry_cfg or {}))
        self.vocab = CompactVocab.load(vocab_path)
        self.spec = ModelSpec(**{**spec, "vocab_size": self.vocab.size})
        self.settings, self.seed, self.temperature = settings, seed, temperature
        # Refuse a bad checkpoint layout before any model exists (critic-overwrites-actor); rank 0 writes.
        self.ckpt = CheckpointManager.from_base(ckpt_base, save_every=self.settings.save_every)
        self.retention = Retention(self.ckpt.actor_dir.parent, needs_critic=self.settings.mode == "ppo",
                                   **(retention or CheckpointsConfig(keep_last=None)).model_dump())
        self.last_report = CheckpointReport()
        self.published: dict[int, dict[str, torch.Tensor]] = {}  # version -> this rank's behaviour shard
        self._ws_rank, self._weight_peers, self._plan = rank, [], None  # the weight sync's (rl.weights.sender)
        self._fetched: set[int] | None = None  # trials this rank fetched in full this step (fetch_shard)
        self._collective_watch = lambda what: contextlib.nullcontext()
        self.trainer: RankTrainer | None = None
        self.steps_applied = StepLedger()  # a retried train call never repeats a step (retried-train-step)
        if self.world_size == 1:  # a group of one: its world is this process; the trainer exists at once
            # the process group gets the configured Gloo timeout, never the library default
            init_single_process(timeout_s=dist_guard.timeout_for("gloo", self.guards).total_seconds())
            # log-probs at the sampling temperature: the engine reports temperature-scaled ones
            self.trainer = Trainer(self.spec, self.settings, seed=seed, unk_id=self.vocab.unk_id,
                                   temperature=temperature, max_tokens_per_gpu=self.layout.max_tokens_per_gpu)
            if model_path:  # [model] path: start from the checkpoint a team brings (actor; critic trunk)
                actor, critic = pretrained_states(model_path, self.vocab, self.trainer.critic is not None)
                self.trainer.warm_load(actor_state=actor, critic_state=critic)
            self._after_build()

    def address(self) -> str:
        """Rank 0: the rendezvous on its own node, one fresh port per attempt (group-init-race:
        ``t1ops.guards.rendezvous``, bounded by ``guards.field.group_init_timeout_s``)."""
        return plan_rendezvous(ray.util.get_node_ip_address(), self.guards.field)

    def join(self, init_method: str) -> int:
        """World > 1: initial weights (world of 1), then the real world and megatron's groups; the pid."""
        if self.model_path:  # [model] path: each rank reads the units of its own shard (rl.hf.reader)
            actor, critic = pretrained_states(self.model_path, self.vocab, self.settings.mode == "ppo")
        else:
            actor, critic = full_initial_states(self.spec, self.settings, self.seed, self.vocab.unk_id)
        timeout = join_world(self.rank, self.world_size, init_method, self.layout, guards=self.guards,
                             seed=self.seed)
        self.beacon = ProgressBeacon(self.run_dir / "ranks" / f"rank{self.rank}.progress")
        self._collective_watch = collective_watch(timeout, self.guards)
        self.trainer = RankTrainer(self.spec, self.settings, self.layout, full_actor=actor, full_critic=critic,
                                   unk_id=self.vocab.unk_id, seed=self.seed, temperature=self.temperature,
                                   on_micro_batch=self.beacon, watch=self._collective_watch)
        self.build_weight_plan()  # every rank at once: who sends which tensor to the engines
        telemetry.event("trainer.rank_joined", rank=self.rank, world_size=self.world_size,
                        tp_rank=self.trainer.tp_rank, dp_rank=self.trainer.dp_rank, ep_rank=self.trainer.ep_rank,
                        timeout_s=timeout.total_seconds())
        self._after_build()
        return os.getpid()

    def _after_build(self) -> None:
        if self.settings.critic_warm_load:  # every rank loads the full critic and keeps its shard
            self.warm_load_critic(self.settings.critic_warm_load)

    # --- warm start ----------------------------------------------------------------
    def warm_start(self, examples: list[tuple[str, str]], num_steps: int, batch_size: int = 16) -> list[float]:
        """Supervised steps on (instruction, solution command) pairs; returns the loss curve."""
        if num_steps > 0 and not examples:
            raise ConfigError("trainer.warm_start_steps > 0 but no task in the pool has solution/solve.sh; "
                              "add solutions or set trainer.warm_start_steps = 0", key="trainer.warm_start_steps")
        renderer = ChatRenderer.default()
        seqs = [sft_example(instr, cmd, renderer) for instr, cmd in examples]
        seqs = [(self.vocab.encode_inputs(t), m) for t, m in seqs]
        rng = random.Random(self.seed)
        losses = []
        for g in self.trainer.actor_optimizer.param_groups:
            g["lr"] = self.settings.warm_start_lr
        for _ in range(num_steps):
            batch = rng.sample(seqs, min(batch_size, len(seqs)))
            stats = self.trainer.sft_step([np.asarray(t) for t, _ in batch], [np.asarray(m) for _, m in batch])
            losses.append(float(stats.loss))
        # RL starts from the warm-started weights with a fresh optimizer (as RL starts from an SFT
        # checkpoint): Adam's second moments from supervised gradients would shrink RL's first steps.
        self.trainer.actor_optimizer = build_optimizer(self.trainer.actor, self.settings.actor_lr, self.settings)
        return losses

    def warm_load_critic(self, path: str) -> str:
        """Load the critic's weights from an earlier run (``trainer.critic_warm_load``): a critic step
        dir, or a critic role dir whose newest step is taken. The step count stays 0, so the first
        ``critic_warmup_steps`` steps recalibrate it (T1 report, section 04). Returns the step dir."""
        if self.trainer.critic is None:
            raise ConfigError("trainer.critic_warm_load is set but trainer.mode = 'grpo' has no critic",
                              key="trainer.critic_warm_load")
        if is_hf_dir(path):  # a Hugging Face directory: its trunk, a fresh value head (docs/model.md)
            self.trainer.load_full(critic=pretrained_states(path, self.vocab, True)[1])
            self.warm_loaded_critic = str(path)
            return str(path)
        step_dir = Path(path)
        if not (step_dir / "manifest.json").exists() and step_dir.is_dir() and list_steps(step_dir):
            step_dir = step_dir / step_dir_name(list_steps(step_dir)[-1])
        if not step_dir.is_dir():
            raise ConfigError(f"trainer.critic_warm_load = {path!r}: no such checkpoint directory; give an earlier "
                              "run's checkpoints/critic/step_N (or checkpoints/critic)", key="trainer.critic_warm_load")
        self.trainer.load_role("critic", CheckpointReader(step_dir, "critic"))  # any format, any layout
        self.warm_loaded_critic = str(step_dir)
        return str(step_dir)

    # --- RL ----------------------------------------------------------------------------
    def build_batch(self, credit: CreditBatch) -> TrainBatch:
        """The batch of a step, as the credit stage decided it (``t1ops.campaign.credit``): every chunk
        of every trainable trial (chunks fetched) with its trained reward; a trajectory's chunks share
        its id; the baseline-only trials count in their groups; prompt_mean's unit is the group. A row
        this rank trains must come from a trial it fetched in full (else its forward would read
        placeholder routing rows): a named error."""
        tokens, masks, lps, rewards, groups, routing, tids = [], [], [], [], [], [], []
        for r, reward in zip(credit.trials, credit.rewards):
            for c in r.chunks:
                self.vocab.encode_targets(c.tokens[c.loss_mask.astype(bool)])  # sampled ids must be sampleable
                tokens.append(np.asarray(self.vocab.encode_inputs(c.tokens), dtype=np.int64))
                masks.append(c.loss_mask)
                lps.append(c.rollout_logprobs)
                rewards.append(float(reward))
                groups.append(r.group_id)
                routing.append(c.routing)
                tids.append(r.sample_id or id(r))
        has_routing = all(x is not None for x in routing)
        batch = TrainBatch.from_sequences(tokens=tokens, loss_mask=masks, rollout_logprobs=lps, rewards=rewards,
                                          group_ids=groups, prompt_ids=list(groups),
                                          routing=routing if has_routing else None, trajectory_ids=tids,
                                          baseline_only=list(credit.baseline_only))
        if self._fetched is not None:
            trial_of = [i for i, _ in batch_rows(list(credit.trials))]
            rows = {r for mb in self.trainer.plan(batch) for r in mb.rows if r != FILLER}
            stray = sorted({trial_of[r] for r in rows} - self._fetched)
            if stray:
                raise DataContractError(f"trainer rank {self.rank} (dp rank {self.trainer.dp_rank}) trains rows of "
                                        f"trials {stray[:8]} it did not fetch; dataplane.shard_trials must split "
                                        "as RankTrainer.plan does", rank=self.rank)
        return batch

    def train(self, credit: CreditBatch, behaviour: str = "snapshot", step: int | None = None) -> TrainReport:
        """One RL step on the credit stage's batch; old log-probs are recomputed under the weights
        that sampled it (``behaviour="rollout"``, fully async: the per-token rollout log-probs are
        the behaviour). A batch with no signal takes no optimizer step (``TrainReport.skipped``; every
        rank gets the same credit, so all skip together). A world of 1 fetches every chunk; a rank of a
        larger world only its data-parallel shard's (the light arrays of all, the full chunks of the
        trials its rows come from: ``dataplane.fetch_shard``). ``step``: the campaign step; a retried
        call for a step already applied gets that step's report back and trains nothing
        (t1ops.guards.step_once, retried-train-step)."""
        repeated = None if step is None else self.steps_applied.applied(step)
        if repeated is not None:
            return repeated
        report = self._train(credit, behaviour)
        if step is not None:
            self.steps_applied.done(step, report)
        return report

    def _train(self, credit: CreditBatch, behaviour: str) -> TrainReport:
        credit = require_credit(credit, "TrainerHost.train")
        if credit.no_signal is not None:
            return TrainReport(skipped=credit.no_signal)
        t0, mbs0 = time.perf_counter(), self.trainer.micro_batches_done
        dp, dp_rank = self.layout.dp, self.trainer.dp_rank
        if self.world_size == 1:
            trials = fetch(list(credit.trials))  # straight from the object store (t1ops.campaign.dataplane)
            staged = [i for i, r in enumerate(credit.trials) if r.staged]
            fetched = {"staged": len(staged), "fetched": staged, "light_bytes": 0,
                       "fetched_bytes": sum(credit.trials[i].payload.nbytes for i in staged)}
        else:
            trials, fetched = fetch_shard(list(credit.trials), lambda light: shard_trials(light, dp, dp_rank))
            self._fetched = set(fetched["fetched"]) if fetched["staged"] else None
        report = self._step(credit.with_trials(trials), behaviour)
        info = RankInfo(rank=self.rank, dp_rank=dp_rank, train_s=round(time.perf_counter() - t0, 3),
                        micro_batches=self.trainer.micro_batches_done - mbs0, staged=fetched["staged"],
                        fetched=list(fetched["fetched"]), fetched_bytes=fetched["fetched_bytes"],
                        light_bytes=fetched["light_bytes"])
        if self.world_size > 1:
            telemetry.gauge("trainer.rank_fetched_bytes", info.fetched_bytes, rank=self.rank)
            telemetry.gauge("trainer.rank_train_s", info.train_s, rank=self.rank)
            telemetry.gauge("trainer.rank_micro_batches", info.micro_batches, rank=self.rank)
            telemetry.event("trainer.rank_step", step=report.stats.step, **dataclasses.asdict(info))
        return dataclasses.replace(report, rank_info=info)

    def _step(self, credit: CreditBatch, behaviour: str) -> TrainReport:
        chunks = [c for r in credit.trials for c in r.chunks]
        if behaviour == "rollout":
            return self._train_on_rollout_logprobs(credit, chunks)
        versions = {int(v) for c in chunks for v in c.policy_version[c.loss_mask == 1]}
        if len(versions) != 1 or next(iter(versions)) not in self.published:
            raise DataContractError(f"batch sampled by policy versions {sorted(versions)}; the trainer holds "
                                    f"snapshots of {sorted(self.published)} (one version per batch expected)")
        # The behaviour policy is the snapshot of the version that sampled this batch: with the
        # one-step pipeline that is one version behind the trainer's current weights.
        self.trainer.set_behaviour(self.published[next(iter(versions))])
        stats = self.trainer.train_step(self.build_batch(credit))
        return TrainReport(stats=stats, behaviour_version=next(iter(versions)))

    def _train_on_rollout_logprobs(self, credit: CreditBatch, chunks: list) -> TrainReport:
        """Fully async: trajectories may span versions; every sampled token must name a version
        this trainer published (never a future one, never none)."""
        sampled = np.concatenate([c.policy_version[c.loss_mask == 1] for c in chunks])
        latest = max(self.published) if self.published else -1
        if sampled.size and (sampled.min() < 0 or sampled.max() > latest):
            raise DataContractError(f"sampled tokens carry policy versions {sorted(set(sampled.tolist()))[:8]}; "
                                    f"valid versions are 0..{latest} (the trainer's published ones)")
        self.trainer.set_behaviour(None)  # the proximal policy for TIS / gap: the current weights
        stats = self.trainer.train_step(self.build_batch(credit), behaviour="rollout")
        return TrainReport(stats=stats, policy_versions=sorted({int(v) for v in sampled.tolist()}))

    def is_resume_point(self, version: int, final: bool) -> bool:
        """The full checkpoint (both roles and the trainer state) is written every ``save_every``
        steps and at the run's last step; every other publish only hands weights to the engines."""
        return final or version % self.settings.save_every == 0

    def newest_actor_checkpoint(self) -> str | None:
        """The newest saved actor step directory (None before the first save)."""
        steps = list_steps(self.ckpt.actor_dir)
        return str(self.ckpt.actor_dir / step_dir_name(steps[-1])) if steps else None

    def publish(self, version: int, final: bool = False) -> str | None:
        """Keep this rank's shard of the actor as ``version`` (what it sends to the engines: nothing is
        gathered); at a resume point (:meth:`is_resume_point`)
        save the checkpoint: both roles (a world of 1 whole, a larger world by shard, every rank its
        own slice) and every rank's optimizer and RNG state (``trainer_state``; a larger world: each rank's
        in its own file, rank 0 commits the step). Every rank
        keeps its shard as the behaviour snapshot of the batch the engines sample next; older than the
        previous one are dropped. Called inside the weight-sync barrier; rank 0 returns the newest
        actor checkpoint directory."""
        self.published[version] = self.trainer.snapshot_behaviour()  # also what this rank sends to the engines
        resume_point = self.is_resume_point(version, final)
        ranks = None
        if resume_point:
            self._save_roles(version)
            ranks = self._gather_rank_states(version)
        if self.rank == 0:
            if resume_point:
                one = self.world_size == 1  # else ``ranks`` are the rank files' entries, moved into the step
                save_trainer_state(self.retention.base, version, trainer_state(self.trainer, version, ranks if one
                                                                               else None), None if one else ranks)
                self.retention.check_saved(version)  # every role the run needs (critic-checkpoint-skipped)
            deleted = self.retention.apply()
            self.last_report = CheckpointReport(disk_bytes(self.retention.base), len(deleted),
                                                self.retention.resume_point())
        for old in sorted(self.published)[:-2]:
            del self.published[old]
        return self.newest_actor_checkpoint() if self.rank == 0 else None

    def _full(self, role: str, version: int) -> dict[str, torch.Tensor]:
        """A world of 1's whole model of ``role``: the actor is the behaviour snapshot just kept (no second
        copy), the critic a detached copy."""
        if role == "actor":
            return {k: v for k, v in self.published[version].items() if isinstance(v, torch.Tensor)}
        return {k: v.detach().clone() for k, v in weights_state_dict(self.trainer.critic).items()}

    def _save_roles(self, version: int) -> None:
        """Both roles of ``version``: a world of 1 whole (the actor is the published snapshot, no second
        copy), a larger world by shard (every rank writes its own; nothing is gathered)."""
        roles = ("actor", "critic") if self.trainer.critic is not None else ("actor",)
        if self.world_size == 1:
            for role in roles:
                self.ckpt.save(role, version, self._full(role, version))
            return
        with self._collective_watch("sharded checkpoint save"):
            for role in roles:
                save_sharded(self.ckpt.actor_dir.parent, role, version, self.trainer)

    def _gather_rank_states(self, version: int) -> list[dict] | None:
        """A world of 1: its optimizer and RNG state. A larger world: every rank writes its own file
        (``save_rank_state``, nothing gathered); rank 0 gets the files' entries."""
        if self.world_size == 1:
            return [rank_state(self.trainer)]
        return save_rank_states(self.retention.base, version, self.rank, self.world_size, self.trainer,
                                self._collective_watch)

    def checkpoint_report(self) -> CheckpointReport:
        """Disk used by checkpoints after the last publish, steps deleted, and the resume point."""
        return self.last_report

    def resume(self, step: int) -> dict:
        """Every rank: its shard of both roles at ``step`` (verified; its own file at the saved layout, else
        re-sharded tensor by tensor: ``CheckpointReader``), its own optimizer and RNG state, the step
        count; the actor of ``step`` is the behaviour snapshot of the next batch. Returns what was loaded."""
        roles = ("actor", "critic") if self.trainer.critic is not None else ("actor",)
        how = {role: load_into(self.trainer, role, self.ckpt.dir_for(role) / step_dir_name(step), self.rank)
               for role in roles}
        # another layout: the optimizer re-sharded from every saved rank (t1ops.campaign.reshard)
        state, how["trainer_state"] = restore_rank_state(self.trainer, self.retention.base, step, self.rank,
                                                         self.world_size)
        self.published = {step: self.trainer.snapshot_behaviour()}  # what this rank sends to the engines
        telemetry.event("checkpoint.resumed_shards", rank=self.rank, step=step, **how)
        return {**resumed(self, step, state, "critic" in roles), "loaded": how}

    def checkpoint_dirs(self) -> dict:
        return {"actor": str(self.ckpt.actor_dir), "critic": str(self.ckpt.critic_dir)}

    # --- guard hooks -----------------------------------------------------------------
    def num_params(self) -> tuple[int, int]:
        """(actor, critic) parameter counts of this rank's shard, for the host-memory projection."""
        count = lambda m: 0 if m is None else sum(p.numel() for p in m.parameters())  # noqa: E731
        return count(self.trainer.actor), count(self.trainer.critic)

    def install_stack_dump(self, path: str) -> int:
        """Let the watchdog dump this process's Python stacks (SIGUSR1); returns the pid."""
        self._stack_file = install_stack_dump(path)
        return os.getpid()


def require_credit(credit, where: str) -> CreditBatch:
    """``credit`` as a :class:`~t1ops.campaign.credit.CreditBatch`; a TypeError naming the fix for
    anything else (trial results: the coordinator's credit stage turns them into one)."""
    if not isinstance(credit, CreditBatch):
        raise TypeError(f"{where} takes a t1ops.campaign.credit.CreditBatch, got a {type(credit).__name__}; "
                        "pass the settled trials through t1ops.campaign.credit.assign_credit first")
    return credit
