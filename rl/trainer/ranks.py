"""The trainer: one rank of a megatron layout (DP x TP(+SP) x PP x CP x EP), actor and critic.

This is the only implementation of the PPO/GRPO step (loss assembly, behaviour
plan, gradients, optimizer steps): the 1-rank :class:`~rl.trainer.trainer.Trainer`
is its world-size-1 case.

Every rank of the layout builds a :class:`RankTrainer` after its process
group and megatron's parallel state exist (``rl.megatron_cpu.init_model_parallel``;
t1ops creates the group with explicit timeouts). Actor and critic SHARE the
ranks: both are sharded over the same layout and run one after the other in
the step (critic first), as the report's actor and critic time-share their
GPUs (docs/parallelism.md).

Initial weights are layout-free: :func:`full_initial_states` builds the
models in a world of 1 exactly as the 1-rank trainer does and returns their
weights; each rank keeps its shard (``rl.trainer.shard``). So a 2-rank and a
1-rank trainer start from the same weights, and a checkpoint of one layout
loads into another.

The step: the whole batch's reduction weights, GAE, advantages, TIS and the
log-prob gap are computed on full ``[B, T]``
tensors (per-sample forward results gathered over DP); only forwards and
backwards run per rank, per micro-batch (``rl.trainer.packing``), with
gradients accumulated, reduced and clipped by the global norm
(``rl.trainer.grads``). ``on_micro_batch`` is called after every micro-batch
(the progress watchdog's heartbeat).

Every micro-batch loop runs through the pipeline schedule (``rl.trainer.pipeline``):
``forward_only`` for log-probs and values, ``one_f_one_b`` for the updates. With one stage
that is forward, loss, backward per micro-batch; with ``pp`` stages the loss, its tallies and
the per-token results are the last stage's, handed to every stage (``from_last_stage``), and
each stage replays the R3 rows of its own layers (``rl.trainer.rank_forward``). Weights
leave and enter a rank under the whole model's names (``pipeline.global_shard`` /
``stage_state``), so the gathers, checkpoints and loads are layout-free at any ``pp``.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Mapping

import torch
import torch.distributed as dist

from rl import model as rmodel
from rl.advantages import compute_gae, whiten_advantages
from rl.errors import InputError
from rl.losses import dppo_loss, ppo_clip_loss, reduction_weights, tis_weights, value_loss
from rl.metrics import checked_logprob_gap, explained_variance
from rl.trainer import pipeline as pl
from rl.trainer import rank_forward as rf
from rl.trainer.batch import TrainBatch
from rl.trainer.grads import Tally, comm_device, reduce_clip_step
from rl.trainer.optim import build_optimizer, lr_factor, set_lr
from rl.trainer.packing import MicroBatch, mini_batch_rows, pack_to_ranks, plan_micro_batches
from rl.trainer.rank_weights import RankWeights
from rl.trainer.settings import Layout, TrainerSettings
from rl.trainer.sft import SftStats
from rl.trainer.step import (StepStats, behaviour_plan, grpo_token_advantages, masked_token_mean,
                             swapped_weights)


def full_initial_states(spec, settings: TrainerSettings, seed: int, unk_id: int | None):
    """(actor, critic or None) weights of the 1-rank Trainer with ``seed``; call before joining a world."""
    from rl.megatron_cpu import init_single_process, teardown

    init_single_process()
    actor, critic = build_models(spec, settings, seed, unk_id)
    states = (rmodel.weights_state_dict(actor), None if critic is None else rmodel.weights_state_dict(critic))
    teardown()
    return states


def build_models(spec, settings: TrainerSettings, seed: int, unk_id: int | None, sequence_parallel: bool = False):
    """The actor (``seed``) and, in PPO mode, the critic (``seed + 1``), fp32, on the current layout."""
    actor = rmodel.build_policy(spec, seed, torch.float32, unk_id=unk_id, sequence_parallel=sequence_parallel)
    critic = rmodel.build_critic(spec, seed + 1, sequence_parallel=sequence_parallel) \
        if settings.mode == "ppo" else None
    return actor, critic


class RankTrainer(RankWeights):
    """Actor (+ critic in PPO) shards on this rank, their optimizers, the distributed step; its weights'
    loads, gathers and shards are :class:`~rl.trainer.rank_weights.RankWeights`'."""

    def __init__(self, spec, settings: TrainerSettings, layout: Layout, *,
                 full_actor: Mapping[str, torch.Tensor] | None, full_critic: Mapping[str, torch.Tensor] | None,
                 unk_id: int | None, seed: int = 0, temperature: float = 1.0,
                 on_micro_batch: Callable[[int], None] | None = None,
                 watch: Callable[[str], contextlib.AbstractContextManager] | None = None) -> None:
        """``full_actor``/``full_critic`` None: keep the weights built from ``seed`` (world of 1 only)."""
        from megatron.core import parallel_state as ps

        if dist.get_world_size() != layout.world_size:
            raise InputError(f"layout needs {layout.world_size} ranks (dp*tp*pp*cp), the process group has "
                             f"{dist.get_world_size()}", world_size=dist.get_world_size())
        if not temperature >= 0:
            raise InputError(f"temperature must be >= 0, got {temperature!r}", argument="temperature")
        self.spec, self.settings, self.layout = spec, settings, layout
        # greedy sampling (0) reports log-probs of the unscaled distribution, as SGLang does
        self.temperature = temperature if temperature > 0 else 1.0
        self.tp_rank, self.dp_rank = ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank()
        self.ep_rank = ps.get_expert_model_parallel_rank()
        self.dp_group = ps.get_data_parallel_group()
        self.actor, self.critic = build_models(spec, settings, seed, unk_id, layout.sequence_parallel)
        for model, full, role in ((self.actor, full_actor, "actor"), (self.critic, full_critic, "critic")):
            if model is not None and full is None and layout.world_size > 1:
                raise InputError(f"a {layout.world_size}-rank trainer needs the {role}'s full initial weights "
                                 "(rl.trainer.ranks.full_initial_states)", argument=f"full_{role}")
            if model is not None and full is not None:
                self._load(model, full)
        self.actor_optimizer = build_optimizer(self.actor, settings.actor_lr, settings)
        self.critic_optimizer = None if self.critic is None else \
            build_optimizer(self.critic, settings.critic_lr, settings)
        self.step = 0  # RL steps taken (SFT steps are not counted)
        self.micro_batches_done = 0
        self._behaviour: dict[str, torch.Tensor] | None = None  # this rank's shard of the behaviour policy
        self._on_micro_batch = on_micro_batch
        self._watch = watch or (lambda name: contextlib.nullcontext())

    # --- plan -----------------------------------------------------------------------------
    def plan(self, batch: TrainBatch, rows: list[int] | None = None) -> list[MicroBatch]:
        """This rank's micro-batches of ``rows`` (None: every row); all ranks compute the same plan
        from the same batch. A row stays on the rank the whole batch packs it to, whatever part of
        it is planned: that rank alone holds its routing rows (``dataplane.fetch_shard``); a rank
        with no row in the part joins the gradient reduction with zeros (``reduce_grads``)."""
        lengths = batch.num_tokens_B.tolist()
        per_rank = pack_to_ranks(lengths, self.layout.dp)
        if rows is not None:
            keep = set(rows)
            per_rank = [[i for i in r if i in keep] for r in per_rank]
        plans = plan_micro_batches(per_rank, lengths, self.layout.max_tokens_per_gpu, self.layout.sp_size,
                                   aligned=self.layout.ep > 1)
        return plans[self.dp_rank]

    def _tick(self) -> None:
        self.micro_batches_done += 1
        if self._on_micro_batch is not None:
            self._on_micro_batch(self.micro_batches_done)

    def _actor_lp(self, batch, mb, replay, temperature: float | None = None, with_entropy: bool = False):
        return rf.actor_logprobs(self.actor, batch, mb, replay=replay, sp_size=self.layout.sp_size,
                                 sp_rank=self.tp_rank, with_entropy=with_entropy,
                                 temperature=self.temperature if temperature is None else temperature)

    def _gather(self, parts: dict[int, torch.Tensor], batch: TrainBatch) -> torch.Tensor:
        """Full ``[B, T]`` of the last stage's per-sample results, on every rank."""
        with self._watch("data-parallel gather"):
            full = rf.gather_samples(parts, tuple(batch.tokens_BT.shape), self.dp_group)
        with self._watch("pipeline broadcast (last stage's results)"):
            return pl.from_last_stage(full)

    def _totals(self, tally: Tally) -> dict[str, float]:
        """The last stage's tallies (where the losses are), summed over DP, on every rank."""
        totals = tally.total(self.dp_group) if self.actor.post_process else None
        with self._watch("pipeline broadcast (last stage's results)"):
            return pl.from_last_stage(totals)

    def _forward_each(self, model, plan: list[MicroBatch], forward, collect) -> None:
        pl.run_forwards(model, plan, forward, collect, sp_size=self.layout.sp_size, watch=self._watch, tick=self._tick)

    def _train_each(self, model, plan: list[MicroBatch], forward, loss) -> None:
        pl.run_updates(model, plan, forward, loss, sp_size=self.layout.sp_size, watch=self._watch, tick=self._tick)

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, plan: list[MicroBatch] | None = None, *, replay: bool | None = None,
                 behaviour: bool = False, with_entropy: bool = False):
        """Full token-aligned ``[B, T]`` log-probs of the actor (under the behaviour snapshot if asked);
        ``with_entropy``: ``(logprobs, token-mean entropy over the loss tokens)``."""
        plan = self.plan(batch) if plan is None else plan
        replay = self.settings.r3 if replay is None else replay
        parts: dict[int, torch.Tensor] = {}
        entropy: dict[int, torch.Tensor] = {}
        self.actor.eval()

        def keep(mb, out) -> None:
            rf.collect(mb, out[0] if with_entropy else out, parts)
            if with_entropy:
                rf.collect(mb, out[1], entropy)

        with swapped_weights(self.actor, self._behaviour if behaviour else None):
            self._forward_each(self.actor, plan,
                               lambda mb: self._actor_lp(batch, mb, replay, with_entropy=with_entropy), keep)
        logprobs_BT = self._gather(parts, batch)
        if not with_entropy:
            return logprobs_BT
        return logprobs_BT, masked_token_mean(self._gather(entropy, batch), batch.loss_mask_BT)

    def behaviour_logprobs(self, batch: TrainBatch, plan: list[MicroBatch] | None = None, *,
                           with_entropy: bool = False):
        """Old log-probs recomputed under the behaviour snapshot (R3 as configured); see :meth:`logprobs`."""
        return self.logprobs(batch, plan, behaviour=True, with_entropy=with_entropy)

    @torch.no_grad()
    def _values(self, batch: TrainBatch, plan: list[MicroBatch]) -> torch.Tensor:
        parts: dict[int, torch.Tensor] = {}
        self.critic.eval()
        self._forward_each(self.critic, plan, lambda mb: rf.critic_values(self.critic, batch, mb),
                           lambda mb, values: rf.collect(mb, values, parts))
        return self._gather(parts, batch)

    # --- the step -----------------------------------------------------------------------------
    def _weighted(self, loss_bT: torch.Tensor, w_bT: torch.Tensor) -> torch.Tensor:
        return (torch.where(w_bT > 0, loss_bT, 0.0) * w_bT).sum()

    def mini_batches(self, batch: TrainBatch, plan: list[MicroBatch],
                     weights_BT: torch.Tensor) -> list[tuple[list[MicroBatch], torch.Tensor]]:
        """(this rank's micro-batches, reduction weights) of each optimizer step of an epoch: the
        whole batch, or its ``trainer.mini_batches`` parts (``rl.trainer.packing.mini_batch_rows``),
        each reduced on its own as a separate batch would be. A part without a loss token is left
        out on every rank alike."""
        if self.settings.mini_batches == 1:
            return [(plan, weights_BT)]
        out = []
        for rows in mini_batch_rows(batch.group_ids, self.settings.mini_batches):
            mask = torch.zeros_like(batch.loss_mask_BT)
            mask[rows] = batch.loss_mask_BT[rows]
            if mask.any():
                out.append((self.plan(batch, rows), reduction_weights(mask, self.settings.loss_reduction,
                                                                      batch.prompt_ids)))
        return out

    def _critic_update(self, batch, minis, old_BT, returns_BT) -> tuple[dict, float]:
        """``ppo_epochs`` x mini-batches value steps; the last epoch's tallies and mean pre-clip norm."""
        s, mask_BT = self.settings, batch.loss_mask_BT
        self.critic.train()
        for _ in range(s.ppo_epochs):
            tally, norms = Tally(), []
            for plan, weights_BT in minis:
                norms.append(self._critic_pass(batch, plan, weights_BT, old_BT, returns_BT, mask_BT, tally,
                                               len(minis)))
        return self._totals(tally), sum(norms) / len(norms)

    def _critic_pass(self, batch, plan, weights_BT, old_BT, returns_BT, mask_BT, tally, num_minis) -> float:
        """One optimizer step of the critic over ``plan``; returns its pre-clip gradient norm."""
        s = self.settings

        def loss(mb, values):
            loss_bT, stats = value_loss(values, rf.slice_rows(old_BT, mb), rf.slice_rows(returns_BT, mb),
                                        rf.slice_rows(mask_BT, mb, fill=False), clip=s.value_clip)
            out = self._weighted(loss_bT, rf.slice_rows(weights_BT, mb))
            tally.add(stats, ("clip_fraction",), float(out.detach()) / num_minis)
            return out

        self._train_each(self.critic, plan, lambda mb: rf.critic_values(self.critic, batch, mb), loss)
        with self._watch("gradient all-reduce (critic)"):
            return reduce_clip_step(self.critic, self.critic_optimizer, s.grad_clip)

    def _actor_update(self, batch, minis, advantages, old_BT, tis_BT) -> tuple[dict, float, dict]:
        """``ppo_epochs`` x mini-batches clipped steps: PPO against ``old_BT``, or DPPO against the
        rollout's log-probs. Returns the last epoch's tallies, its mean pre-clip grad norm and the
        first epoch's forward (``{"logprobs": {sample: [n]}, "entropy": ...}``, this rank's samples)."""
        s, mask_BT = self.settings, batch.loss_mask_BT
        adv_BT = advantages if advantages.dim() == 2 else advantages[:, None].expand(mask_BT.shape).contiguous()
        first: dict[str, dict[int, torch.Tensor]] = {"logprobs": {}, "entropy": {}}
        self.actor.train()
        for epoch in range(s.ppo_epochs):
            tally, norms = Tally(), []
            for plan, weights_BT in minis:
                norms.append(self._actor_pass(batch, plan, weights_BT, adv_BT, old_BT, tis_BT, tally, first,
                                              epoch, len(minis)))
        return self._totals(tally), sum(norms) / len(norms), first

    def _actor_pass(self, batch, plan, weights_BT, adv_BT, old_BT, tis_BT, tally, first, epoch, num_minis) -> float:
        """One optimizer step of the actor over ``plan``; returns its pre-clip gradient norm."""
        s, mask_BT = self.settings, batch.loss_mask_BT
        key = "clip_fraction" if s.mode == "ppo" else "tv_masked_fraction"
        extra = ("dual_clip_fraction",) if s.mode == "ppo" else ()

        def loss(mb, lp):
            mask = rf.slice_rows(mask_BT, mb, fill=False)
            if epoch == 0:
                lp, entropy = lp
                rf.collect(mb, lp, first["logprobs"])
                rf.collect(mb, entropy, first["entropy"])
            adv = rf.slice_rows(adv_BT, mb)
            if s.mode == "ppo":
                loss_bT, stats = ppo_clip_loss(lp, rf.slice_rows(old_BT, mb), adv, mask, s.clip_low, s.clip_high,
                                               s.clip_ratio_c)
            else:
                loss_bT, stats = dppo_loss(lp, rf.slice_rows(batch.rollout_logprobs_BT, mb), adv, mask,
                                           *s.dppo_deltas)
            if tis_BT is not None:
                loss_bT = loss_bT * rf.slice_rows(tis_BT, mb)
            out = self._weighted(loss_bT, rf.slice_rows(weights_BT, mb))
            tally.add(stats, (key, "ratio_mean", "approx_kl") + extra, float(out.detach()) / num_minis)
            return out

        self._train_each(self.actor, plan, lambda mb: self._actor_lp(batch, mb, s.r3, with_entropy=epoch == 0), loss)
        with self._watch("gradient all-reduce (actor)"):
            return reduce_clip_step(self.actor, self.actor_optimizer, s.grad_clip)

    def train_step(self, batch: TrainBatch, *, behaviour: str = "snapshot") -> StepStats:
        """Critic step (PPO), then the actor's clipped step unless in critic warm-up.

        ``behaviour`` (``rl.trainer.step.behaviour_plan``): ``"snapshot"`` recomputes old log-probs
        under the behaviour snapshot; ``"rollout"`` takes the per-token rollout log-probs (fully
        async). GRPO without TIS needs no recompute: the log-prob gap and TIS stats are then
        measured on the first epoch's forward of the current weights."""
        s, mask_BT, bp = self.settings, batch.loss_mask_BT, behaviour_plan(self.settings, behaviour)
        if batch.num_loss_tokens == 0:
            raise InputError("the batch has no loss-bearing token; skip it explicitly rather than "
                             "stepping on nothing", num_samples=batch.num_samples)
        plan = self.plan(batch)
        weights_BT = reduction_weights(mask_BT, s.loss_reduction, batch.prompt_ids)
        minis = self.mini_batches(batch, plan, weights_BT)
        lr_scale = lr_factor(self.step, s)
        set_lr(self.actor_optimizer, s.actor_lr * lr_scale)
        if self.critic_optimizer is not None:
            set_lr(self.critic_optimizer, s.critic_lr * lr_scale)
        critic = None
        if s.mode == "ppo":
            old_values_BT = self._values(batch, plan)
            advantages, returns_BT = compute_gae(batch.rewards_B, old_values_BT, mask_BT, s.gamma, s.lam)
            ev = explained_variance(old_values_BT, returns_BT, mask_BT)
            if s.advantage_whitening:  # the returns (critic targets) stay raw
                advantages = whiten_advantages(advantages, mask_BT)
            critic = (ev, *self._critic_update(batch, minis, old_values_BT, returns_BT))
        else:
            advantages = grpo_token_advantages(batch, s.grpo_norm_by_std)
        old_BT, behaviour_entropy = self.behaviour_logprobs(batch, plan=plan, with_entropy=True) \
            if bp.recompute else (None, math.nan)
        tis_BT = None
        if bp.apply_tis:  # apply_tis implies recompute
            tis_BT, _ = tis_weights(old_BT, batch.rollout_logprobs_BT, mask_BT, s.tis_cap, s.tis_mode)
        actor_updated = self.step >= s.critic_only_steps()
        ratio_old_BT = batch.rollout_logprobs_BT if bp.ratio_from_rollout else old_BT
        actor = self._actor_update(batch, minis, advantages, ratio_old_BT, tis_BT) \
            if actor_updated else None
        entropy = behaviour_entropy
        if actor is not None and len(minis) == 1:  # several steps: later parts' forwards saw updated weights
            entropy = masked_token_mean(self._gather(actor[2]["entropy"], batch), mask_BT)
        if old_BT is None:  # GRPO without TIS (its actor always steps): measure on the first epoch's forward
            old_BT = self._gather(actor[2]["logprobs"], batch)
        _, tis = tis_weights(old_BT, batch.rollout_logprobs_BT, mask_BT, s.tis_cap,
                             "token" if s.tis_mode == "off" else s.tis_mode)
        gap = checked_logprob_gap(old_BT, batch.rollout_logprobs_BT, mask_BT, s.gap_reducer)
        self.step += 1
        adv_BT = advantages if advantages.dim() == 2 else advantages[:, None].expand(mask_BT.shape)
        nan = math.nan
        a = actor[0] if actor else {}
        return StepStats(
            step=self.step, mode=s.mode, actor_updated=actor_updated, num_samples=batch.num_samples,
            num_tokens=batch.num_loss_tokens, reward_mean=float(batch.rewards_B.mean()),
            explained_variance=float(critic[0]) if critic else nan, logprob_gap=float(gap),
            clip_fraction=a.get("clip_fraction", a.get("tv_masked_fraction", nan)),
            ratio_mean=a.get("ratio_mean", nan), policy_loss=a.get("loss", nan),
            value_loss=critic[1]["loss"] if critic else nan, actor_grad_norm=actor[1] if actor else nan,
            critic_grad_norm=critic[2] if critic else nan, tis_mean=tis["tis_mean"],
            tis_max_raw=tis["tis_max_raw"], tis_clip_fraction=tis["tis_clip_fraction"],
            advantage_mean=float(adv_BT[mask_BT].mean()), dual_clip_fraction=a.get("dual_clip_fraction", nan),
            tis_mode=s.tis_mode, behaviour_recomputed=bp.recompute,
            # the actor's first forward; a critic-only step has none, but its actor has not moved since
            # the behaviour snapshot it was published as, so the behaviour forward is the same policy
            entropy=entropy, actor_lr=s.actor_lr * lr_scale, kl_behaviour=a.get("approx_kl", nan),
            optimizer_steps=s.ppo_epochs * len(minis) if actor_updated else 0)

    def sft_step(self, tokens, loss_mask) -> SftStats:
        """Supervised step (token-mean NLL, free routing), data-parallel over the same packer."""
        import numpy as np

        zeros = [np.zeros(len(t), dtype=np.float32) for t in tokens]
        batch = TrainBatch.from_sequences(tokens=list(tokens), loss_mask=list(loss_mask), rollout_logprobs=zeros,
                                          rewards=[0.0] * len(tokens), group_ids=list(range(len(tokens))),
                                          prompt_ids=list(range(len(tokens))))
        plan = self.plan(batch)
        weights_BT = reduction_weights(batch.loss_mask_BT, "token_mean")
        self.actor.train()
        total = torch.zeros(1, dtype=torch.float64, device=comm_device())

        def loss(mb, lp):
            out = -self._weighted(lp, rf.slice_rows(weights_BT, mb))
            total.add_(float(out.detach()))
            return out

        self._train_each(self.actor, plan, lambda mb: self._actor_lp(batch, mb, False, temperature=1.0), loss)
        with self._watch("gradient all-reduce (actor)"):
            norm = reduce_clip_step(self.actor, self.actor_optimizer, self.settings.grad_clip)
        dist.all_reduce(total, group=self.dp_group)
        total = pl.from_last_stage(total)
        return SftStats(float(total.item()), batch.num_loss_tokens, norm)
