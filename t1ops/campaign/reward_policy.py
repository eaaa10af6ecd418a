"""What each trial trains on: the trained reward and loss mask from the verifier's verdict.

The verdict's reward (``TrialResult.reward``, CTRF passed / S with tagged fallbacks) is logged
as it is; this module derives what the trainer sees, one place for every pipeline (the
trainer host applies it when it assembles a batch). The rules, each a config key:

- ``rewards.mode`` "binary": 1 when the verdict says fully solved, else 0 (T1 report,
  section 06, the binary-reward runs); "dense": the verdict's reward.
- ``rewards.shape_length``: one of the report's three length-shaping variants
  (``rl.rewards.shape_length``; section 06), over the batch (the efficiency bonus ranks
  fully-solved trials within same-test-count buckets).
- ``rollout.truncated_reward_zero``: a trial whose last turn hit ``max_new_tokens``
  without a tool call trains on reward 0 (SkyRL walkthrough, section 5).
- ``rollout.context_overflow_clear_mask``: a trial that ran out of context trains with
  its loss mask cleared; its reward still counts in its GRPO group (walkthrough, section 5).
- ``rollout.failed_trials`` "zero": a trial that raised is kept as reward 0, mask 0
  (the worker sends it with no chunks): it counts in its group's baseline only.
- ``rollout.zero_variance_filter``: groups whose trained rewards are all equal are
  dropped (no GRPO signal), counted; when every group is, the batch is kept and counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rl.length_shaping import LengthShaping, shape_length
from t1ops.campaign.trials import TrialResult, require_results


@dataclass(frozen=True)
class RewardPolicy:
    mode: str = "dense"
    shape_length: str = "none"
    shaping: dict = field(default_factory=dict)   # LengthShaping fields
    truncated_reward_zero: bool = False
    context_overflow_clear_mask: bool = False
    zero_variance_filter: bool = False

    @classmethod
    def from_config(cls, cfg) -> "RewardPolicy":
        """From a ``CampaignConfig``'s [rewards] and [rollout] sections."""
        rw, r = cfg.rewards, cfg.rollout
        shaping = {k: getattr(rw, k) for k in ("free_turns", "power", "zero_pass_value", "penalty_per_turn",
                                               "max_penalty", "bonus")}
        return cls(mode=rw.mode, shape_length=rw.shape_length, shaping=shaping,
                   truncated_reward_zero=r.truncated_reward_zero,
                   context_overflow_clear_mask=r.context_overflow_clear_mask,
                   zero_variance_filter=r.zero_variance_filter)


@dataclass
class Prepared:
    """Per trial, in input order: ``rewards`` trained, ``trainable`` (its chunks become batch rows);
    ``baseline_only``: (group, reward) of kept trials without rows; ``counts`` for the step line."""

    results: list[TrialResult]
    rewards: list[float]
    trainable: list[bool]
    baseline_only: list[tuple[str, float]]
    counts: dict[str, Any]


def is_solved(r: TrialResult) -> bool:
    """Fully solved by the verdict: every CTRF test passed, or a Harbor reward >= 1 (rl.agent.verdict)."""
    if r.solved is not None:
        return bool(r.solved)
    return bool(r.total) and r.passed == r.total


def prepare(results: list[TrialResult], policy: RewardPolicy) -> Prepared:
    """The trained reward and whether each trial has batch rows (see the module docstring)."""
    results = require_results(results, "reward_policy.prepare")
    failed = [r.failed for r in results]
    base = [1.0 if is_solved(r) else 0.0 for r in results] if policy.mode == "binary" \
        else [float(r.reward) for r in results]
    rewards = list(base)
    if policy.shape_length != "none" and results:
        turns = torch.tensor([float(r.num_turns) for r in results], dtype=torch.float64)
        reward_t = torch.tensor(rewards, dtype=torch.float64).clamp(min=0.0) \
            if policy.shape_length == "multiplicative" else torch.tensor(rewards, dtype=torch.float64)
        kw = {}
        if policy.shape_length == "efficiency_bonus":
            kw = {"solved": torch.tensor([is_solved(r) for r in results]),
                  "bucket": torch.tensor([int(r.total or 0) for r in results])}
        rewards = shape_length(reward_t, turns, policy.shape_length, LengthShaping(**policy.shaping), **kw).tolist()
    truncated = [r.end_reason == "truncated" for r in results]
    if policy.truncated_reward_zero:
        rewards = [0.0 if t else x for t, x in zip(truncated, rewards)]
    rewards = [0.0 if f else x for f, x in zip(failed, rewards)]
    overflow = [r.end_reason == "context_exhausted" for r in results]
    trainable = [not f and not (policy.context_overflow_clear_mask and o) and bool(r.chunks)
                 for r, f, o in zip(results, failed, overflow)]
    counts: dict[str, Any] = {
        "failed_kept_zero": sum(failed),
        "truncated_zeroed": sum(t and x != 0 for t, x in zip(truncated, base)) if policy.truncated_reward_zero else 0,
        "mask_cleared_overflow": sum(o and not f for o, f in zip(overflow, failed))
        if policy.context_overflow_clear_mask else 0,
        "zero_variance_groups_dropped": 0, "zero_variance_kept_all": False}
    if policy.zero_variance_filter:
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(results):
            groups.setdefault(r.group_id, []).append(i)
        flat = {g for g, idx in groups.items() if len({rewards[i] for i in idx}) <= 1}
        if flat and len(flat) == len(groups):
            counts["zero_variance_kept_all"] = True  # no group has signal: keep them, say so
        else:
            counts["zero_variance_groups_dropped"] = len(flat)
            keep = [r.group_id not in flat for r in results]
            results = [r for r, k in zip(results, keep) if k]
            rewards = [x for x, k in zip(rewards, keep) if k]
            trainable = [t for t, k in zip(trainable, keep) if k]
    baseline_only = [(r.group_id, x) for r, x, t in zip(results, rewards, trainable) if not t]
    trained = [x for x, t in zip(rewards, trainable) if t]
    counts["reward_trained_mean"] = sum(trained) / len(trained) if trained else float("nan")
    return Prepared(results, rewards, trainable, baseline_only, counts)
