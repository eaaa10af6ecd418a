"""What the coordinator gets back from the trainer role: typed answers, never dicts read by key.

:class:`TrainReport` is the answer to ``train`` (any world size: a multi-rank trainer answers
rank 0's, with every rank's :class:`RankInfo`), :class:`CheckpointReport` the answer to
``checkpoint_report``. They cross Ray pickled, so this module imports nothing heavy: the
step stats are ``rl.trainer.step.StepStats`` (``None`` when the credit stage found no signal
and the optimizer step was skipped, ``skipped`` saying why).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the type only: the coordinator's side reads it without importing the trainer
    from rl.trainer.step import StepStats


@dataclass(frozen=True)
class RankInfo:
    """One trainer rank's share of a step (per-rank telemetry in the step row)."""

    rank: int
    dp_rank: int
    train_s: float
    micro_batches: int
    staged: int
    fetched: list[int]
    fetched_bytes: int
    light_bytes: int


@dataclass(frozen=True)
class TrainReport:
    """One ``train`` call's answer."""

    stats: StepStats | None = None         # None: the optimizer step was skipped
    skipped: str | None = None             # why the step was skipped (credit.CreditBatch.no_signal)
    behaviour_version: int | None = None   # snapshot behaviour: the version that sampled the batch
    policy_versions: list[int] = field(default_factory=list)  # rollout behaviour: versions of the sampled tokens
    rank_info: RankInfo | None = None      # this rank's share (multi-rank trainer)
    ranks: list[RankInfo] = field(default_factory=list)       # every rank's share (filled by the combiner)

    def value(self, name: str) -> float:
        """A step statistic, NaN when the step was skipped (the row keeps its columns)."""
        return math.nan if self.stats is None else float(getattr(self.stats, name))

    @property
    def num_tokens(self) -> int:
        return 0 if self.stats is None else int(self.stats.num_tokens)

    @property
    def actor_updated(self) -> bool:
        return self.stats is not None and bool(self.stats.actor_updated)


@dataclass(frozen=True)
class CheckpointReport:
    """Disk used by checkpoints after the last publish, steps deleted, and the resume point."""

    checkpoint_bytes: int = 0
    checkpoints_deleted: int = 0
    resume_point: int | None = None

    def as_row(self) -> dict:
        return {"checkpoint_bytes": self.checkpoint_bytes, "checkpoints_deleted": self.checkpoints_deleted,
                "resume_point": self.resume_point}
