"""The coordinator: the campaign's step loop on Ray.

Roles (docs/architecture.md, runtime topology): engines (SGLang-protocol servers; the
embedded CPU engine by default), one rollout worker per node (agent loop and
sandboxes), the trainer (actor + critic), and this coordinator (step loop,
weight-sync barrier, guardrails, telemetry).

Every mode takes the same step (:func:`take_step`); what differs is the batch
source: :class:`~t1ops.campaign.rollouts.PipelinedSource` (sync, one_step) or
:class:`~t1ops.campaign.async_loop.AsyncSource` (fully_async, docs/async.md).

The one-step pipeline: while the trainer takes step t on batch t, the workers
already generate batch t+1 with the weights they have. When both are done the
barrier pauses the engines, publishes the trainer's weights (the actor's
checkpoint directory, loaded by ``/update_weights_from_disk``), rotates the
behaviour snapshot and resumes. Step time is max(rollout, train) + sync, and
each batch is trained with its real behaviour policy as the PPO denominator.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import ray

from t1ops import telemetry
from t1ops.campaign.async_loop import AsyncSource
from t1ops.campaign.barrier import engine_barrier
from t1ops.campaign.credit import CreditBatch, assign_credit
from t1ops.campaign.dataplane import write_dumps
from t1ops.campaign.group_ledger import audit_groups
from t1ops.campaign.guarding import CampaignGuards
from t1ops.campaign.progress import Progress
from t1ops.campaign.reward_policy import RewardPolicy
from t1ops.campaign.roles import TrainReport
from t1ops.campaign.rollouts import PipelinedSource, Rollouts
from t1ops.campaign.rundir import RunDir
from t1ops.campaign.summary import Summary
from t1ops.campaign.trials import TrialResult
from t1ops.campaign.trialtrace import step_split
from t1ops.config import CampaignConfig

if TYPE_CHECKING:  # the type only: the handle's module imports the trainer (torch, megatron)
    from t1ops.campaign.rank_actors import TrainerGroup


@dataclass
class Campaign:
    """Handles on the running roles (filled in by :func:`start_roles`)."""

    cfg: CampaignConfig
    run: RunDir
    trainer: TrainerGroup | None = None  # the trainer's ranks (t1ops.campaign.rank_actors; 1 rank or N)
    router: object = None             # Ray actor: t1ops.campaign.engines.EngineRouter
    sender: object = None             # the trainer actor that pushes weights (rank 0: TrainerGroup.sender)
    store: object = None              # Ray actor: t1ops.campaign.dataplane.TrajectoryStore (object_store plane)
    workers: list = field(default_factory=list)   # Ray actors: RolloutWorker, one per node
    rollouts: Rollouts | None = None
    guards: CampaignGuards | None = None
    warm_start_loss: list[float] = field(default_factory=list)
    evaluator: object = None          # t1ops.campaign.evaluation.Evaluator when eval.every_steps > 0
    eval_tasks: list = field(default_factory=list)  # held-out task names (empty: no evaluation)
    resume_from: int | None = None    # the verified step a resumed run continues from (None: a new run)
    on_step: list = field(default_factory=list)   # callables (campaign, step) run as each step starts

    @property
    def reward_policy(self) -> RewardPolicy:
        """What the credit stage applies (``t1ops.campaign.credit``), from the config."""
        return RewardPolicy.from_config(self.cfg)


def _metrics_row(step: int, results: list[TrialResult], credit: CreditBatch, report: TrainReport,
                 rollout_s: float, train_s: float, step_s: float, sync_s: float) -> dict:
    rewards = [r.reward for r in results]
    return {"step": step, "reward_mean": float(np.mean(rewards)) if rewards else math.nan,
            "explained_variance": report.value("explained_variance"), "logprob_gap": report.value("logprob_gap"),
            "turns_mean": float(np.mean([r.num_turns for r in results])) if results else math.nan,
            "tokens": report.num_tokens, "rollout_s": round(rollout_s, 3),
            "train_s": round(train_s, 3), "step_s": round(step_s, 3), "sync_s": round(sync_s, 3),
            "solved_share": float(np.mean([bool(r.total) and r.passed == r.total for r in results])),
            "no_verdict": sum(r.reward_source == "no-verdict" for r in results),
            "clip_fraction": report.value("clip_fraction"), "tis_mean": report.value("tis_mean"),
            "actor_grad_norm": report.value("actor_grad_norm"), "num_trajectories": len(results),
            "policy_loss": report.value("policy_loss"), "value_loss": report.value("value_loss"),
            "reward_sources": _count(r.reward_source for r in results),
            # every non-CTRF reward named by its source and why CTRF was not used (T1 report, section 06)
            "reward_fallbacks": _count(f"{r.reward_source} ({r.reward_fallback or 'no CTRF tag'})"
                                       for r in results if r.reward_source != "ctrf"),
            "entropy": report.value("entropy"), "actor_updated": report.actor_updated,
            "optimizer_skipped": report.skipped,  # the credit stage found no signal: no optimizer step
            # the optimizer (docs/campaign.md, "Optimizer"): LR after warmup/schedule, steps taken, KL moved
            "actor_lr": report.value("actor_lr"),
            "optimizer_steps": report.value("optimizer_steps"),
            "kl_behaviour": report.value("kl_behaviour"), "critic_grad_norm": report.value("critic_grad_norm"),
            "reward_trained_mean": credit.reward_trained_mean, "reward_policy": credit.counts.as_row(),
            "end_reasons": _count(r.end_reason for r in results),
            "compactions": sum(r.compactions for r in results),
            "summary_failures": sum(r.summary_failures for r in results)}


def _count(items) -> dict:
    out: dict = {}
    for it in items:
        out[it] = out.get(it, 0) + 1
    return out


def batch_source(c: Campaign):
    """The run mode's batch source: the one difference between the modes (docs/async.md)."""
    if c.cfg.pipeline_mode == "fully_async":
        return AsyncSource(c)
    return PipelinedSource(c.rollouts, pipelined=c.cfg.pipeline_mode == "one_step", steps=c.cfg.run.steps)


def step_loop(c: Campaign, summary: Summary, progress: Progress) -> None:
    """Run ``cfg.run.steps`` RL steps; every mode takes the same step (:func:`take_step`), the batch
    source differs: sync, one_step (module docstring) or fully_async (``t1ops.campaign.async_loop``)."""
    first = (c.resume_from or 0) + 1  # the data-sampler position: task order is a function of the step
    source, ev = batch_source(c), c.evaluator
    if ev is not None and not any(e["step"] == first - 1 for e in summary.evals):
        ev.maybe_submit(first - 1)  # the warm-started (or resumed) weights, evaluated while the step runs
    source.start(first, summary)
    try:
        for step in range(first, c.cfg.run.steps + 1):
            take_step(c, source, summary, progress, step)
    finally:
        source.stop(summary)
    audit_run_groups(c, summary)
    if ev is not None and (evaluated := ev.collect()) is not None:  # the last step's weights
        progress.log(progress.eval_text(evaluated))
        last = c.guards.check_health({"step": evaluated["step"], **eval_books(evaluated)}, [])
        if last.get("health_alarms"):  # the step rows are written: the event and this line say it
            progress.log(f"evaluation of step {evaluated['step']} | ALARM {' '.join(last['health_alarms'])}")


def eval_books(evaluated: dict | None) -> dict:
    """An evaluation row's planned and scored trials (``t1ops.campaign.evaluation.eval_row``), the
    fields health.eval-shrinking reads from a step row ({} when no evaluation finished)."""
    if evaluated is None:
        return {}
    return {k: evaluated[k] for k in ("eval_expected", "eval_num_trials", "eval_failed")}


def audit_run_groups(c: Campaign, summary: Summary) -> dict:
    """Every group trained exactly once across any resume (``t1ops.campaign.group_ledger``); an
    error event names what was lost or trained twice (runbooks/resume-drops-buffered.md)."""
    audit = audit_groups({"steps": summary.steps, "async_books": summary.extra.get("async_books")},
                         c.cfg.pipeline_mode)
    summary.extra["group_audit"] = audit
    summary.save()
    if not audit["ok"]:
        telemetry.event("campaign.groups_lost_or_repeated", severity="error", problems="; ".join(audit["problems"]))
    return audit


def take_step(c: Campaign, source, summary: Summary, progress: Progress, step: int) -> dict:
    """One step of any mode: batch, train, weight sync (with the eval around it), the step row."""
    t_step, ev = time.monotonic(), c.evaluator
    for hook in c.on_step:  # e.g. a chaos fault schedule
        hook(c, step)
    batch = source.take(step, progress)
    results = batch.results
    credit = assign_credit(results, c.reward_policy)  # decided once, here, for every mode (t1ops.campaign.credit)
    progress.update(step=step, phase="train", in_flight=source.in_flight)
    t_train = time.monotonic()
    c.guards.train_submitted(step)
    telemetry.event("campaign.train_submitted", step=step)  # progress events: chaos fires faults on them
    train_ref = c.trainer.train(credit, source.behaviour, step)
    source.while_training(train_ref, c.guards)  # generation goes on while step t trains
    report = c.guards.wait_train(train_ref, step)
    if report.skipped is not None:
        telemetry.event("trainer.step_skipped", severity="warn", step=step, reason=report.skipped)
    train_s = time.monotonic() - t_train
    telemetry.event("campaign.train_done", step=step)
    source.before_sync()  # what must not span the weight sync is drained
    evaluated = ev.collect() if ev is not None else None  # nor an eval request: each eval sees exactly its weights
    cache = ray.get(c.router.cache_stats.remote())  # before the sync starts the engines' next window
    t_sync = time.monotonic()
    ckpt = ray.get(c.trainer.publish(step, step == c.cfg.run.steps))  # the last step is a resume point
    telemetry.event("campaign.sync_barrier", step=step)
    with engine_barrier(c.router, step, ckpt) as barrier:  # the coordinator owns the transaction
        barrier.push_from(c.sender)
    sync = barrier.report
    source.after_sync()
    sync_s = time.monotonic() - t_sync
    telemetry.event("campaign.sync_done", step=step)
    if ev is not None:
        ev.maybe_submit(step)  # runs while step + 1 rolls out and trains
    write_dumps(c.workers, c.run, step, results, debug=c.cfg.rollout.debug_dump)  # by the workers that hold them
    row = _metrics_row(step, results, credit, report, batch.rollout_s, train_s, time.monotonic() - t_step, sync_s)
    row.update(ray.get(c.trainer.checkpoint_report()).as_row())  # disk used, retention
    row.update(engines_recreated=sync["recreated"], engines_dead=sync["dead"], mode=c.cfg.pipeline_mode,
               **cache, **source.row_fields(step, batch), **step_split(results, batch.rollout_s))
    row.update(eval_books(evaluated))  # an evaluation finished with this step: health.eval-shrinking reads it
    c.guards.after_step(step)
    row.update(c.guards.check_health(row, results))  # run-health alarms (t1ops/guards/run_health.py)
    row["guards_s"] = round(c.guards.take_busy_s(), 4)  # the coordinator guards' own overhead
    if report.ranks:  # per-rank timing of a multi-rank trainer
        row["ranks"] = [dataclasses.asdict(r) for r in report.ranks]
    source.before_row(summary)
    summary.add_step(row)
    source.after_step()
    for key in ("reward_mean", "explained_variance", "logprob_gap", "step_s"):
        if not math.isnan(row[key]):  # NaN: not defined this step (e.g. EV with constant returns)
            telemetry.gauge(f"campaign.{key}", row[key], step=step)
    progress.update(step=step, phase="done", row=row, engines=ray.get(c.router.describe.remote()),
                    evaluation=ev.latest if ev is not None else None)
    return row
