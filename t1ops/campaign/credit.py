"""The credit stage: what a step trains on, decided once, on the coordinator (docs/campaign.md, "Credit").

Between the settled trials and the trainer, for every run mode (sync, one_step, fully_async):

1. the trained reward of every trial (``t1ops.campaign.reward_policy.trained_rewards``: dense or
   binary, length shaping, truncation, failed trials at 0), judged per batch, or per group in
   fully_async (a group is judged when it settles: :func:`judge_group`, called by
   ``GroupBuffer.on_done``, and the batch's credit recomputes the same numbers);
2. what is trainable (its chunks become batch rows) and what only counts in its group's
   baseline: a failed trial (reward 0, mask 0), a trial whose context overflowed under
   ``rollout.context_overflow_clear_mask``, a trial with no chunks;
3. the zero-variance filter on those trained rewards (:func:`flat_groups`: the one function
   every mode uses; sync/one_step under ``rollout.zero_variance_filter``, fully_async in the
   group buffer under ``fully_async.zero_variance_filter``);
4. whether the batch carries any signal: none when no trial is trainable, or when the trainer's
   advantages are group-relative (GRPO) and every group's trained rewards are equal (every
   advantage is 0). Such a batch skips the optimizer step (Adam's momentum and weight decay
   would still move the weights) and the step row says why (``optimizer_skipped``).

The trainer gets a :class:`CreditBatch` and executes it: it fetches the trainable trials'
chunks, builds the batch with these rewards, groups and baselines, and decides nothing.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from t1ops.campaign.reward_policy import RewardPolicy, trained_rewards
from t1ops.campaign.trials import TrialResult, require_results


@dataclass(frozen=True)
class CreditCounts:
    """What the credit stage did to one step's trials (the step row's ``reward_policy``)."""

    failed_kept_zero: int = 0              # failed trials kept at reward 0, mask 0
    truncated_zeroed: int = 0              # truncated trials whose reward was set to 0
    mask_cleared_overflow: int = 0         # context_exhausted trials kept in the baseline only
    zero_variance_groups_dropped: int = 0
    zero_variance_kept_all: bool = False   # every group was flat: kept (and counted), not dropped

    def as_row(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CreditBatch:
    """One step's credit: the trainer's whole input besides the chunks it fetches itself."""

    trials: tuple[TrialResult, ...]                 # trainable trials, batch order: their chunks are the rows
    rewards: tuple[float, ...]                      # the trained reward of each of ``trials``
    baseline_only: tuple[tuple[str, float], ...]    # (group id, trained reward) of kept trials without rows
    counts: CreditCounts
    no_signal: str | None = None                    # why the optimizer step is skipped; None: it runs

    @property
    def group_ids(self) -> list[str]:
        return [r.group_id for r in self.trials]

    @property
    def reward_trained_mean(self) -> float:
        return float(np.mean(self.rewards)) if self.rewards else math.nan

    def with_trials(self, trials: list[TrialResult]) -> "CreditBatch":
        """The same credit over ``trials`` (the trainer's fetched copies of :attr:`trials`)."""
        if [r.sample_id for r in trials] != [r.sample_id for r in self.trials]:
            raise ValueError("with_trials takes the credit's own trials, in its order")
        return CreditBatch(tuple(trials), self.rewards, self.baseline_only, self.counts, self.no_signal)


def is_flat(rewards: list[float]) -> bool:
    """True when every reward of a group is the same (GRPO centring leaves no signal)."""
    return len(rewards) > 0 and float(np.ptp(np.asarray(rewards, dtype=np.float64))) == 0.0


def flat_groups(rewards: list[float], group_ids: list[str]) -> set[str]:
    """The groups whose trained rewards are all equal: the zero-variance filter of every mode."""
    by_group: dict[str, list[float]] = {}
    for g, x in zip(group_ids, rewards):
        by_group.setdefault(g, []).append(x)
    return {g for g, xs in by_group.items() if is_flat(xs)}


def credit_rewards(results: list[TrialResult], policy: RewardPolicy) -> list[float]:
    """Trained rewards in input order: judged over the batch, or group by group (``policy.per_group``)."""
    if not policy.per_group:
        return trained_rewards(results, policy)
    out = [0.0] * len(results)
    for idx in _group_index(results).values():
        for i, x in zip(idx, trained_rewards([results[i] for i in idx], policy)):
            out[i] = x
    return out


def judge_group(results: list[TrialResult], policy: RewardPolicy) -> list[float]:
    """Fully async: the trained rewards of one settled group (what the buffer's filter judges)."""
    return credit_rewards(require_results(results, "credit.judge_group"), policy)


def assign_credit(results: list[TrialResult], policy: RewardPolicy) -> CreditBatch:
    """The credit of one step's settled trials (see the module docstring)."""
    results = require_results(results, "credit.assign_credit")
    rewards = credit_rewards(results, policy)
    overflow = [r.end_reason == "context_exhausted" and not r.failed for r in results]
    trainable = [not r.failed and not (policy.context_overflow_clear_mask and o) and num_chunks(r) > 0
                 for r, o in zip(results, overflow)]
    truncated_zeroed = sum(r.end_reason == "truncated" and not r.failed and float(r.reward) != 0
                           for r in results) if policy.truncated_reward_zero else 0
    flat = flat_groups(rewards, [r.group_id for r in results]) if policy.zero_variance_filter else set()
    groups = _group_index(results)
    kept_all = bool(flat) and len(flat) == len(groups)
    keep = [kept_all or r.group_id not in flat for r in results]
    counts = CreditCounts(failed_kept_zero=sum(r.failed for r in results), truncated_zeroed=truncated_zeroed,
                          mask_cleared_overflow=sum(overflow) if policy.context_overflow_clear_mask else 0,
                          zero_variance_groups_dropped=0 if kept_all else len(flat),
                          zero_variance_kept_all=kept_all)
    rows = [(r, x) for r, x, t, k in zip(results, rewards, trainable, keep) if k and t]
    baseline = tuple((r.group_id, x) for r, x, t, k in zip(results, rewards, trainable, keep) if k and not t)
    credit = CreditBatch(tuple(r for r, _ in rows), tuple(x for _, x in rows), baseline, counts)
    return CreditBatch(credit.trials, credit.rewards, baseline, counts, no_signal(credit, policy))


def no_signal(credit: CreditBatch, policy: RewardPolicy) -> str | None:
    """Why ``credit`` cannot move the weights usefully, or None (see the module docstring, 4)."""
    if not credit.trials:
        return "no trainable trial (every trial failed, overflowed with its mask cleared, or has no rows)"
    if not policy.group_relative:
        return None  # PPO: the critic's values give every trajectory an advantage
    rewards = list(credit.rewards) + [x for _, x in credit.baseline_only]
    gids = credit.group_ids + [g for g, _ in credit.baseline_only]
    trained = set(credit.group_ids)
    if trained <= flat_groups(rewards, gids):
        return f"every group's trained rewards are equal ({len(trained)} group(s)): GRPO advantages are all 0"
    return None


def num_chunks(r: TrialResult) -> int:
    """A trial's trajectory chunks, whether it carries them or they are staged (dataplane.Payload)."""
    if r.chunks is not None:
        return len(r.chunks)
    return 0 if r.payload is None else int(r.payload.num_chunks)


def _group_index(results: list[TrialResult]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(results):
        groups.setdefault(r.group_id, []).append(i)
    return groups
