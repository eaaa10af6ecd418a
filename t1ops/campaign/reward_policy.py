"""What reward each trial trains on: the trained reward from the verifier's verdict.

The verdict's reward (``TrialResult.reward``, CTRF passed / S with tagged fallbacks) is logged
as it is; this module derives the reward the trainer sees. It runs once per trial, in the
credit stage on the coordinator (``t1ops.campaign.credit``), never on the trainer. The rules,
each a config key:

- ``rewards.mode`` "binary": 1 when the verdict says fully solved, else 0 (T1 report,
  section 06, the binary-reward runs); "dense": the verdict's reward.
- ``rewards.shape_length``: one of the report's three length-shaping variants
  (``rl.rewards.shape_length``; section 06), over the rewards judged together (the efficiency
  bonus ranks fully-solved trials within same-test-count buckets): the batch in sync and
  one_step, each group in fully_async (a group is judged when it settles, before any batch).
- ``rollout.truncated_reward_zero``: a trial whose last turn hit ``max_new_tokens`` without a
  tool call (end reason ``truncated``; a full context is ``context_exhausted``, never this)
  trains on reward 0 (SkyRL walkthrough, section 5).
- a failed trial (``rollout.failed_trials = "zero"``) trains on reward 0.

What is trainable, the overflow mask and the zero-variance filter are the credit stage's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rl.length_shaping import LengthShaping, shape_length
from t1ops.campaign.trials import TrialResult


@dataclass(frozen=True)
class RewardPolicy:
    mode: str = "dense"
    shape_length: str = "none"
    shaping: dict = field(default_factory=dict)   # LengthShaping fields
    truncated_reward_zero: bool = False
    context_overflow_clear_mask: bool = False
    zero_variance_filter: bool = False            # sync / one_step (fully_async: GroupBuffer's, same function)
    per_group: bool = False                       # rewards judged per group (fully_async), else per batch
    group_relative: bool = False                  # GRPO: a batch of flat groups carries no signal

    @classmethod
    def from_config(cls, cfg) -> "RewardPolicy":
        """From a ``CampaignConfig``'s [rewards], [rollout], [trainer] sections and its run mode."""
        rw, r = cfg.rewards, cfg.rollout
        shaping = {k: getattr(rw, k) for k in ("free_turns", "power", "zero_pass_value", "penalty_per_turn",
                                               "max_penalty", "bonus")}
        return cls(mode=rw.mode, shape_length=rw.shape_length, shaping=shaping,
                   truncated_reward_zero=r.truncated_reward_zero,
                   context_overflow_clear_mask=r.context_overflow_clear_mask,
                   zero_variance_filter=r.zero_variance_filter, per_group=cfg.pipeline_mode == "fully_async",
                   group_relative=cfg.trainer.mode == "grpo")


def is_solved(r: TrialResult) -> bool:
    """Fully solved by the verdict: every CTRF test passed, or a Harbor reward >= 1 (rl.agent.verdict)."""
    if r.solved is not None:
        return bool(r.solved)
    return bool(r.total) and r.passed == r.total


def trained_rewards(results: list[TrialResult], policy: RewardPolicy) -> list[float]:
    """The trained reward of each trial, in input order, judged together (see the module docstring)."""
    base = [1.0 if is_solved(r) else 0.0 for r in results] if policy.mode == "binary" \
        else [float(r.reward) for r in results]
    rewards = list(base)
    if policy.shape_length != "none" and results:
        turns = torch.tensor([float(r.num_turns) for r in results], dtype=torch.float64)
        reward_t = torch.tensor(rewards, dtype=torch.float64)
        if policy.shape_length == "multiplicative":
            reward_t = reward_t.clamp(min=0.0)
        kw = {}
        if policy.shape_length == "efficiency_bonus":
            kw = {"solved": torch.tensor([is_solved(r) for r in results]),
                  "bucket": torch.tensor([int(r.total or 0) for r in results])}
        rewards = shape_length(reward_t, turns, policy.shape_length, LengthShaping(**policy.shaping), **kw).tolist()
    if policy.truncated_reward_zero:
        rewards = [0.0 if r.end_reason == "truncated" else x for r, x in zip(results, rewards)]
    return [0.0 if r.failed else x for r, x in zip(results, rewards)]
