"""The trainer role: actor + critic on megatron-core, their checkpoints, batch assembly.

Wrapped as a Ray actor by the runner. It turns rollout results (TITO chunks in
tokenizer ids) into a :class:`~rl.trainer.batch.TrainBatch` in the model's
compact ids, takes the step, and publishes the actor for the engines every step
(the weight sync sends that snapshot). The resumable checkpoint (both roles,
role-separated and checksummed, and the trainer state) is written every
``save_every`` steps and at the run's last step, not on every publish.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from rl.agent.loop import sft_example
from rl.chat import ChatRenderer
from rl.errors import ConfigError, DataContractError
from rl.megatron_cpu import init_single_process
from rl.model import ModelSpec, weights_state_dict
from rl.trainer.batch import TrainBatch
from rl.trainer.optim import build_optimizer
from rl.trainer.trainer import Trainer
from rl.vocab import CompactVocab
from rl.weights.sender import WeightSender
from t1ops import telemetry
from t1ops.campaign.credit import CreditBatch
from t1ops.campaign.dataplane import fetch
from t1ops.campaign.resume import load_trainer_state, rng_state, save_trainer_state, set_rng_state, trainer_state
from t1ops.campaign.retention import Retention, disk_bytes
from t1ops.campaign.roles import CheckpointReport, TrainReport
from t1ops.campaign.weight_push import WeightPush
from t1ops.config import CheckpointsConfig, TrainerConfig
from t1ops.guards.checkpoints import CheckpointManager, list_steps, load_checkpoint, step_dir_name
from t1ops.guards.watchdog import install_stack_dump


class TrainerHost(WeightSender, WeightPush):
    def __init__(self, *, spec: dict, settings: TrainerConfig, vocab_path: str, ckpt_base: str, seed: int,
                 num_threads: int = 1, run_dir: str | None = None, telemetry_cfg: dict | None = None,
                 gloo_timeout_s: float = 3600.0, temperature: float = 1.0,
                 retention: CheckpointsConfig | None = None) -> None:
        torch.set_num_threads(num_threads)
        if run_dir is not None:
            telemetry.setup(run_dir, role="trainer", **(telemetry_cfg or {}))
        # The trainer's process group gets the configured Gloo timeout, never the library default.
        init_single_process(timeout_s=gloo_timeout_s)
        self.vocab = CompactVocab.load(vocab_path)
        self.spec = ModelSpec(**{**spec, "vocab_size": self.vocab.size})
        self.settings = settings
        # Refuse a bad checkpoint layout before any model exists (critic-overwrites-actor).
        self.ckpt = CheckpointManager.from_base(ckpt_base, save_every=self.settings.save_every)
        # log-probs at the sampling temperature: the engine reports temperature-scaled ones
        self.trainer = Trainer(self.spec, self.settings, seed=seed, unk_id=self.vocab.unk_id,
                               temperature=temperature, max_tokens_per_gpu=settings.parallel.max_tokens_per_gpu)
        self.seed = seed
        if self.settings.critic_warm_load:
            self.warm_load_critic(self.settings.critic_warm_load)
        self.retention = Retention(self.ckpt.actor_dir.parent, needs_critic=self.trainer.critic is not None,
                                   **(retention or CheckpointsConfig(keep_last=None)).model_dump())
        self.last_report = CheckpointReport()
        self.published: dict[int, dict[str, torch.Tensor]] = {}  # version -> actor weights (behaviour snapshots)

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
        step_dir = Path(path)
        if not (step_dir / "manifest.json").exists() and step_dir.is_dir() and list_steps(step_dir):
            step_dir = step_dir / step_dir_name(list_steps(step_dir)[-1])
        if not step_dir.is_dir():
            raise ConfigError(f"trainer.critic_warm_load = {path!r}: no such checkpoint directory; give an earlier "
                              "run's checkpoints/critic/step_N (or checkpoints/critic)", key="trainer.critic_warm_load")
        state, _ = load_checkpoint(step_dir, "critic")
        self.trainer.warm_load(critic_state=state)
        self.warm_loaded_critic = str(step_dir)
        return str(step_dir)

    # --- RL ----------------------------------------------------------------------------
    def build_batch(self, credit: CreditBatch) -> TrainBatch:
        """The batch of a step, as the credit stage decided it (``t1ops.campaign.credit``): every chunk
        of every trainable trial (chunks fetched) with its trained reward; a trajectory's chunks share
        its id; the baseline-only trials count in their groups; prompt_mean's unit is the group."""
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
        return TrainBatch.from_sequences(tokens=tokens, loss_mask=masks, rollout_logprobs=lps, rewards=rewards,
                                         group_ids=groups, prompt_ids=list(groups),
                                         routing=routing if has_routing else None, trajectory_ids=tids,
                                         baseline_only=list(credit.baseline_only))

    def train(self, credit: CreditBatch, behaviour: str = "snapshot") -> TrainReport:
        """One RL step on the credit stage's batch; old log-probs are recomputed under the weights
        that sampled it (``behaviour="rollout"``, fully async: the per-token rollout log-probs are
        the behaviour). A batch with no signal takes no optimizer step (``TrainReport.skipped``)."""
        credit = require_credit(credit, "TrainerHost.train")
        if credit.no_signal is not None:
            return TrainReport(skipped=credit.no_signal)
        # the chunks, straight from the object store (t1ops.campaign.dataplane)
        return self._step(credit.with_trials(fetch(list(credit.trials))), behaviour)

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
        """Keep the actor of ``version`` for the engines; at a resume point (:meth:`is_resume_point`)
        save the full checkpoint too. Returns the newest actor checkpoint directory.

        Called inside the weight-sync barrier. The weight sync sends the snapshot kept here
        (``_published_weights``), not a checkpoint. It also rotates the behaviour snapshots: the
        weights published now are the behaviour policy of the batch the engines sample next;
        snapshots older than the previous one can no longer be needed and are dropped."""
        if self.is_resume_point(version, final):
            self.ckpt.save("actor", version, weights_state_dict(self.trainer.actor))
            if self.trainer.critic is not None:
                self.ckpt.save("critic", version, weights_state_dict(self.trainer.critic))
            save_trainer_state(self.retention.base, version, self._trainer_state(version))
        self.published[version] = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                                   for k, v in self.trainer.actor_state().items()}
        for old in sorted(self.published)[:-2]:
            del self.published[old]
        deleted = self.retention.apply()
        self.last_report = CheckpointReport(disk_bytes(self.retention.base), len(deleted),
                                            self.retention.resume_point())
        return self.newest_actor_checkpoint()

    def _published_weights(self, version: str):
        """What the weight sync sends for ``version`` (rl.weights.sender): the snapshot publish() kept."""
        state = self.published[int(version)]
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}, self.spec

    def checkpoint_report(self) -> CheckpointReport:
        """Disk used by checkpoints after the last publish, steps deleted, and the resume point."""
        return self.last_report

    def _trainer_state(self, version: int) -> dict:
        return trainer_state(self.trainer, version, [rank_state(self.trainer)])

    def resume(self, step: int) -> dict:
        """Load weights, optimizer states, step count and RNG of ``step`` (verified); the actor
        weights at ``step`` are the behaviour snapshot of the next batch. Returns what was loaded."""
        actor = self.ckpt.load("actor", step)
        critic = self.ckpt.load("critic", step) if self.trainer.critic is not None else None
        state = load_trainer_state(self.retention.base, step)
        self.trainer.load_weights(actor, critic, int(state["step"]))
        load_rank_state(self.trainer, state, rank=0, world_size=1)
        self.published = {step: {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                                 for k, v in self.trainer.actor_state().items()}}
        return resumed(self, step, state, critic is not None)

    def checkpoint_dirs(self) -> dict:
        return {"actor": str(self.ckpt.actor_dir), "critic": str(self.ckpt.critic_dir)}

    # --- guard hooks -----------------------------------------------------------------
    def num_params(self) -> tuple[int, int]:
        """(actor, critic) parameter counts, for the host-memory projection."""
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


def rank_state(trainer) -> dict:
    """One rank's share of the trainer state: its optimizers' states and its RNG (1 rank or N)."""
    return {"rng": rng_state(), "actor_optimizer": trainer.actor_optimizer.state_dict(),
            "critic_optimizer": None if trainer.critic_optimizer is None else trainer.critic_optimizer.state_dict()}


def load_rank_state(trainer, state: dict, *, rank: int, world_size: int) -> None:
    """Restore this rank's optimizers and RNG from a trainer state saved at the same layout."""
    ranks = state.get("ranks") or [state]  # a state written before per-rank states: one rank
    if len(ranks) != world_size:
        raise ConfigError(f"the trainer state holds {len(ranks)} rank(s), this trainer has {world_size}: optimizer "
                          "state is per rank; resume with the run's own trainer.parallel", key="trainer.parallel")
    mine = ranks[rank]
    trainer.actor_optimizer.load_state_dict(mine["actor_optimizer"])
    if trainer.critic_optimizer is not None:
        trainer.critic_optimizer.load_state_dict(mine["critic_optimizer"])
    set_rng_state(mine["rng"])


def resumed(host, step: int, state: dict, has_critic: bool) -> dict:
    """What a resume loaded (the coordinator logs it and records ``campaign.resumed``)."""
    return {"step": step, "trainer_step": host.trainer.step, "next_step": int(state["next_step"]),
            "actor": str(host.ckpt.actor_dir / f"step_{step:08d}"),
            "critic": str(host.ckpt.critic_dir / f"step_{step:08d}") if has_critic else None}
