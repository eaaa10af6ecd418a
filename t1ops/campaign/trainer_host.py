"""The trainer role: actor + critic on megatron-core, their checkpoints, batch assembly.

Wrapped as a Ray actor by the runner. It turns rollout results (TITO chunks in
tokenizer ids) into a :class:`~rl.trainer.batch.TrainBatch` in the model's
compact ids, takes the step, and publishes the actor for the engines every step
(the weight sync sends that snapshot). The resumable checkpoint (both roles,
role-separated and checksummed, and the trainer state) is written every
``save_every`` steps and at the run's last step, not on every publish.
"""
from __future__ import annotations

import random

import numpy as np
import torch

from rl.agent.loop import sft_example
from rl.chat import ChatRenderer
from rl.errors import ConfigError, DataContractError
from rl.model import ModelSpec, weights_state_dict
from rl.trainer.batch import TrainBatch
from rl.trainer.optim import build_optimizer
from rl.trainer.trainer import Trainer
from rl.vocab import CompactVocab
from rl.weights.sender import WeightSender
from t1ops.campaign.dataplane import fetch
from t1ops.campaign.reward_policy import RewardPolicy
from t1ops.campaign.trials import TrialResult, require_results
from t1ops.campaign.weight_push import WeightPush
from t1ops.config import CheckpointsConfig, TrainerConfig
from t1ops.guards.checkpoints import CheckpointManager


def pretrained_states(model_path: str, vocab: CompactVocab, with_critic: bool):
    """(actor, critic or None) full states read on demand from a Hugging Face checkpoint (``[model] path``):
    the actor is the checkpoint, the critic its trunk with a fresh value head (docs/model.md)."""
    from rl.hf.reader import CheckpointState, HFCheckpoint

    from rl.hf.checkpoint import export_vocab

    checkpoint = HFCheckpoint(model_path)
    own = export_vocab(model_path)
    if own is not None:  # rows already indexed by this compact vocabulary: taken as they are
        if own != vocab:
            raise DataContractError(f"{model_path} was exported with another compact vocabulary than this run's "
                                    f"({own.size} vs {vocab.size} ids)", path=model_path)
        vocab = None
    if checkpoint.set_aside:  # said once: the vision tower and MTP layers are not part of the policy
        print(f"model.path: {len(checkpoint.set_aside)} tensor(s) outside the policy set aside "
              f"(first: {checkpoint.set_aside[0]})", flush=True)
    return (CheckpointState(checkpoint, vocab), CheckpointState(checkpoint, vocab, role="critic") if with_critic else None)


class TrainerHost(WeightSender, WeightPush):
    def __init__(self, *, spec: dict, settings: TrainerConfig, vocab_path: str, ckpt_base: str, seed: int,
                 num_threads: int = 1, run_dir: str | None = None, telemetry_cfg: dict | None = None,
                 gloo_timeout_s: float = 3600.0, temperature: float = 1.0,
                 retention: CheckpointsConfig | None = None, reward_policy: RewardPolicy | None = None,
                 model_path: str | None = None) -> None:
        torch.set_num_threads(num_threads)
        if run_dir is not None:
            from t1ops import telemetry

            telemetry.setup(run_dir, role="trainer", **(telemetry_cfg or {}))
        # The trainer's process group gets the configured Gloo timeout, never the library default.
        from rl.megatron_cpu import init_single_process

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
        self.reward_policy = reward_policy or RewardPolicy()
        self.last_policy_counts: dict = {}
        if model_path:  # [model] path: start from the checkpoint a team brings (actor; critic trunk)
            actor, critic = pretrained_states(model_path, self.vocab, self.trainer.critic is not None)
            self.trainer.warm_load(actor_state=actor, critic_state=critic)
        if self.settings.critic_warm_load:
            self.warm_load_critic(self.settings.critic_warm_load)
        from t1ops.campaign.retention import Retention

        self.retention = Retention(self.ckpt.actor_dir.parent, needs_critic=self.trainer.critic is not None,
                                   **(retention or CheckpointsConfig(keep_last=None)).model_dump())
        self.last_report: dict = {}
        self.published: dict[int, dict[str, torch.Tensor]] = {}  # version -> actor weights (behaviour snapshots)
        from t1ops.guards.step_once import StepLedger

        self.steps_applied = StepLedger()  # a retried train call never repeats a step (retried-train-step)

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
        from pathlib import Path

        from t1ops.guards.checkpoints import list_steps, load_checkpoint, step_dir_name

        if self.trainer.critic is None:
            raise ConfigError("trainer.critic_warm_load is set but trainer.mode = 'grpo' has no critic",
                              key="trainer.critic_warm_load")
        from rl.hf.checkpoint import is_hf_dir

        if is_hf_dir(path):  # a Hugging Face directory: its trunk, a fresh value head
            self.trainer.warm_load(critic_state=pretrained_states(path, self.vocab, True)[1])
            self.warm_loaded_critic = str(path)
            return str(path)
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
    def build_batch(self, results: list[TrialResult]) -> TrainBatch:
        """The batch of a step: every chunk of every trainable trial (``t1ops.campaign.reward_policy``
        decides the trained reward and which trials keep rows); a trajectory's chunks share its id."""
        from t1ops.campaign.reward_policy import prepare

        prep = prepare(results, self.reward_policy)
        self.last_policy_counts = prep.counts
        chunks = [(c, r, x) for r, x, t in zip(prep.results, prep.rewards, prep.trainable) if t for c in r.chunks]
        if not chunks:
            raise DataContractError(f"no trial of this step has loss-bearing rows after the reward policy "
                                    f"({prep.counts}); check rollout.failed_trials / context_overflow_clear_mask")
        tokens, masks, lps, rewards, groups, prompts, routing, tids = [], [], [], [], [], [], [], []
        for c, r, reward in chunks:
            loss = c.loss_mask.astype(bool)
            self.vocab.encode_targets(c.tokens[loss])  # sampled ids must be sampleable: else a named error
            tokens.append(np.asarray(self.vocab.encode_inputs(c.tokens), dtype=np.int64))
            masks.append(c.loss_mask)
            lps.append(c.rollout_logprobs)
            rewards.append(float(reward))
            groups.append(r.group_id)
            prompts.append(r.task)
            routing.append(c.routing)
            tids.append(r.sample_id or id(r))
        has_routing = all(x is not None for x in routing)
        return TrainBatch.from_sequences(tokens=tokens, loss_mask=masks, rollout_logprobs=lps, rewards=rewards,
                                         group_ids=groups, prompt_ids=prompts,
                                         routing=routing if has_routing else None, trajectory_ids=tids,
                                         baseline_only=prep.baseline_only)

    def train(self, results: list[TrialResult], behaviour: str = "snapshot", step: int | None = None) -> dict:
        """One RL step on a batch; old log-probs are recomputed under the weights that sampled it
        (``behaviour="rollout"``, fully async: the per-token rollout log-probs are the behaviour).
        ``step``: the campaign step; a retried call for a step already applied gets that step's stats
        back and trains nothing (t1ops.guards.step_once, retried-train-step)."""
        repeated = None if step is None else self.steps_applied.applied(step)
        if repeated is not None:
            return repeated
        stats = self._train(results, behaviour)
        if step is not None:
            self.steps_applied.done(step, stats)
        return stats

    def _train(self, results: list[TrialResult], behaviour: str) -> dict:
        results = fetch(require_results(results, "TrainerHost.train"))  # the chunks, straight from the object store (t1ops.campaign.dataplane)
        if behaviour == "rollout":
            return self._train_on_rollout_logprobs(results)
        versions = {int(v) for r in results for c in r.chunks for v in c.policy_version[c.loss_mask == 1]}
        if len(versions) != 1 or next(iter(versions)) not in self.published:
            raise DataContractError(f"batch sampled by policy versions {sorted(versions)}; the trainer holds "
                                    f"snapshots of {sorted(self.published)} (one version per batch expected)")
        # The behaviour policy is the snapshot of the version that sampled this batch: with the
        # one-step pipeline that is one version behind the trainer's current weights.
        self.trainer.set_behaviour(self.published[next(iter(versions))])
        stats = self.trainer.train_step(self.build_batch(results))
        return {**stats.as_dict(), "behaviour_version": next(iter(versions)), "policy": dict(self.last_policy_counts)}

    def _train_on_rollout_logprobs(self, results: list[TrialResult]) -> dict:
        """Fully async: trajectories may span versions; every sampled token must name a version
        this trainer published (never a future one, never none)."""
        sampled = np.concatenate([c.policy_version[c.loss_mask == 1] for r in results for c in r.chunks])
        latest = max(self.published) if self.published else -1
        if sampled.size and (sampled.min() < 0 or sampled.max() > latest):
            raise DataContractError(f"sampled tokens carry policy versions {sorted(set(sampled.tolist()))[:8]}; "
                                    f"valid versions are 0..{latest} (the trainer's published ones)")
        self.trainer.set_behaviour(None)  # the proximal policy for TIS / gap: the current weights
        stats = self.trainer.train_step(self.build_batch(results), behaviour="rollout")
        return {**stats.as_dict(), "behaviour_version": None, "policy": dict(self.last_policy_counts),
                "policy_versions": sorted({int(v) for v in sampled.tolist()})}

    def is_resume_point(self, version: int, final: bool) -> bool:
        """The full checkpoint (both roles and the trainer state) is written every ``save_every``
        steps and at the run's last step; every other publish only hands weights to the engines."""
        return final or version % self.settings.save_every == 0

    def newest_actor_checkpoint(self) -> str | None:
        """The newest saved actor step directory (None before the first save)."""
        from t1ops.guards.checkpoints import list_steps, step_dir_name

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
            from t1ops.campaign.resume import save_trainer_state

            self.ckpt.save("actor", version, weights_state_dict(self.trainer.actor))
            if self.trainer.critic is not None:
                self.ckpt.save("critic", version, weights_state_dict(self.trainer.critic))
            save_trainer_state(self.retention.base, version, self._trainer_state(version))
            self.retention.check_saved(version)  # every role the run needs (critic-checkpoint-skipped)
        self.published[version] = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                                   for k, v in self.trainer.actor_state().items()}
        for old in sorted(self.published)[:-2]:
            del self.published[old]
        from t1ops.campaign.retention import disk_bytes

        deleted = self.retention.apply()
        self.last_report = {"checkpoint_bytes": disk_bytes(self.retention.base), "checkpoints_deleted": len(deleted),
                            "resume_point": self.retention.resume_point()}
        return self.newest_actor_checkpoint()

    def _published_weights(self, version: str):
        """What the weight sync sends for ``version`` (rl.weights.sender): the snapshot publish() kept."""
        state = self.published[int(version)]
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}, self.spec

    def checkpoint_report(self) -> dict:
        """Disk used by checkpoints after the last publish, steps deleted, and the resume point."""
        return dict(self.last_report)

    def _trainer_state(self, version: int) -> dict:
        from t1ops.campaign.resume import trainer_state

        return trainer_state(self.trainer, version, [rank_state(self.trainer)])

    def resume(self, step: int) -> dict:
        """Load weights, optimizer states, step count and RNG of ``step`` (verified); the actor
        weights at ``step`` are the behaviour snapshot of the next batch. Returns what was loaded."""
        from t1ops.campaign.resume import load_trainer_state

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
        import os

        from t1ops.guards.watchdog import install_stack_dump

        self._stack_file = install_stack_dump(path)
        return os.getpid()


def rank_state(trainer) -> dict:
    """One rank's share of the trainer state: its optimizers' states and its RNG (1 rank or N)."""
    from t1ops.campaign.resume import rng_state

    return {"rng": rng_state(), "actor_optimizer": trainer.actor_optimizer.state_dict(),
            "critic_optimizer": None if trainer.critic_optimizer is None else trainer.critic_optimizer.state_dict()}


def load_rank_state(trainer, state: dict, *, rank: int, world_size: int) -> None:
    """Restore this rank's optimizers and RNG from a trainer state saved at the same layout."""
    from t1ops.campaign.resume import set_rng_state

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
