"""What names one trial, for every path that runs trials: training batches (``rollout``), async
groups (``rollout_group``) and held-out evaluation (``evaluate``) on the rollout worker."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrialSpec:
    task: str
    group_id: str
    sample_idx: int
