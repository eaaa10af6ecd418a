"""Typed trial and group results for tests (t1ops.campaign.trials), built as the worker builds them."""
from __future__ import annotations

from t1ops.campaign.trials import GroupResult, TrialResult


def trial(sample_id: str = "g-s0", reward: float = 0.0, *, group_id: str | None = None, task: str = "t",
          **kw) -> TrialResult:
    """A finished trial; ``group_id`` defaults to the group ``sample_id`` names ("<group>-s<i>")."""
    group_id = group_id if group_id is not None else sample_id.rsplit("-s", 1)[0]
    return TrialResult(task=task, group_id=group_id, sample_id=sample_id, reward=reward,
                       trial_id=kw.pop("trial_id", sample_id), **kw)


def group(gid: str, rewards: list[float], started_step: int = 1) -> GroupResult:
    """A finished fully-async group of ``len(rewards)`` completed trials."""
    results = [trial(f"{gid}-s{i}", r, group_id=gid) for i, r in enumerate(rewards)]
    n = len(results)
    return GroupResult(group_id=gid, task="t", started_step=started_step, results=results, failed={},
                       ledger={"expected": n, "completed": n, "failed": 0, "cancelled": 0, "missing": 0},
                       node="local", duration_s=0.0)
