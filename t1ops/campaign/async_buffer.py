"""The fully async pipeline's bookkeeping: slots, the bounded queue, batches, accounting.

Pure Python (no Ray), so its bounds are property-tested. The walkthrough's loop
(section 8; docs/async.md), in groups:

- :meth:`GroupBuffer.try_start` asks :class:`rl.staleness.StalenessManager` for a
  submission slot; the group is tagged with the step it starts in.
- :meth:`GroupBuffer.on_done` settles a finished group exactly once: a group
  missing trials (failed as a whole, or a trial dropped under ``rollout.failed_trials =
  "drop"``; a failed trial kept at reward 0 under the default "zero" is a full group) or,
  with ``zero_variance_filter`` and ``sample_full_batch``, one whose *trained* rewards are
  all equal (the credit stage's rewards and filter, ``t1ops.campaign.credit.judge_group``
  and ``is_flat``: what the group would train on, never the verifier's raw reward), is
  released (its slot returns; counted); any other is accepted into the bounded queue. Accepting a
  group older than ``max_staleness`` steps records a violation with its lag:
  staleness is a budget, the group is kept.
- :meth:`GroupBuffer.take_batch` hands the trainer ``groups_per_step`` queued
  groups; with ``sample_full_batch`` off, zero-variance groups were queued and
  are dropped from the batch here (counted), so the step trains on fewer.
- :meth:`GroupBuffer.advance` after the weight sync releases the next step's slots.

The queue holds at most ``(max_staleness + 1) * groups_per_step`` groups: the
capacity rule guarantees it (accepted + running <= (S + step) * B and B groups
are consumed per step); a full queue is a :class:`rl.staleness.CapacityError`.

Steps are counted as the run counts them (a resumed run too): a buffer built for
``first_step`` > 1 derives its counters from the rule at that version
(:meth:`rl.staleness.StalenessManager.resumed`), never from a counter the crashed
run left, and :meth:`GroupBuffer.check_budget` after every weight sync names an
inflated budget (docs/async.md, "Resume"; runbooks/staleness-after-recovery.md).
:meth:`GroupBuffer.pending_ids` are the groups a resume must run again.
"""
from __future__ import annotations

import math
import queue
from collections import Counter
from dataclasses import dataclass, field

from rl.errors import ConfigError
from rl.staleness import CapacityError, StalenessManager, StalenessViolation
from t1ops.campaign.credit import is_flat, judge_group
from t1ops.campaign.dataplane import versions_of
from t1ops.campaign.reward_policy import RewardPolicy
from t1ops.campaign.trials import GroupResult, TrialResult

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "staleness-after-recovery": ("fully_async.max_staleness_steps", "fully_async.num_parallel_generation_workers"),
    "queued-groups-age": ("fully_async.max_staleness_steps",),
    "blocking-queue-put": ("fully_async.max_staleness_steps", "fully_async.num_parallel_generation_workers"),
}

OUTCOMES = ("accepted", "zero_variance", "failed", "cancelled")


@dataclass
class Group:
    """A finished group as the buffer sees it (the worker's result, plus what the buffer decided)."""

    data: GroupResult
    started_step: int
    zero_variance: bool = False
    violation: StalenessViolation | None = None

    @property
    def group_id(self) -> str:
        return self.data.group_id


@dataclass
class StepBooks:
    """One step's group accounting (reset by :meth:`GroupBuffer.close_step`)."""

    started: int = 0
    outcomes: Counter = field(default_factory=Counter)   # settled this step, by outcome
    trained: int = 0
    dropped_from_batch: int = 0                          # zero variance, sample_full_batch off
    dropped_ids: list[str] = field(default_factory=list)  # groups settled without being trained
    violations: list[StalenessViolation] = field(default_factory=list)


class GroupBuffer:
    def __init__(self, *, groups_per_step: int, group_size: int, max_staleness: int, num_workers: int,
                 zero_variance_filter: bool = True, sample_full_batch: bool = True,
                 max_draws_factor: int = 8, first_step: int = 1, policy: RewardPolicy | None = None) -> None:
        self.groups_per_step, self.group_size = groups_per_step, group_size
        self.policy = policy or RewardPolicy(per_group=True)  # the credit stage's (RewardPolicy.from_config)
        self.zero_variance_filter, self.sample_full_batch = zero_variance_filter, sample_full_batch
        self.max_draws = max_draws_factor * groups_per_step
        # a resumed run's counters come from the rule at its version, never from the crashed run's
        self.manager = StalenessManager.resumed(max_staleness=max_staleness, batch_size=groups_per_step,
                                                max_concurrency=num_workers, version=first_step - 1)
        self.queue_size = (max_staleness + 1) * groups_per_step
        self.queue: queue.Queue[Group] = queue.Queue(maxsize=self.queue_size)
        self.totals: Counter = Counter()   # submitted, accepted, zero_variance, failed, cancelled, trained, ...
        self.book = StepBooks()

    # --- generation side ----------------------------------------------------------
    def try_start(self) -> int | None:
        """A submission slot (the step to tag the group with), or None at capacity."""
        tag = self.manager.try_start()
        if tag is not None:
            self.totals["submitted"] += 1
            self.book.started += 1
        return tag

    @property
    def running(self) -> int:
        return self.manager.running

    def on_done(self, data: GroupResult | None, started_step: int, *, cancelled: bool = False,
                group_id: str | None = None) -> str:
        """Settle one finished group (``data`` None: it failed as a whole; ``group_id`` names it then).
        Returns its outcome."""
        results = [] if data is None else data.results
        if cancelled:
            outcome = "cancelled"
        elif len(results) < self.group_size:
            outcome = "failed"  # a partial group would skew its group mean: dropped, counted
        elif self.zero_variance_filter and is_flat(judge_group(results, self.policy)):
            outcome = "zero_variance"
        else:
            outcome = "accepted"
        if outcome != "accepted" and not (outcome == "zero_variance" and not self.sample_full_batch):
            self.manager.on_released()
            self._count(outcome)
            gid = data.group_id if data is not None else group_id
            if gid is not None:
                self.book.dropped_ids.append(gid)
            return outcome
        group = Group(data, started_step, zero_variance=outcome == "zero_variance")
        group.violation = self.manager.on_accepted(started_step)
        if group.violation is not None:
            self.book.violations.append(group.violation)
            self.totals["violations"] += 1
        try:
            self.queue.put_nowait(group)
        except queue.Full:
            raise CapacityError(f"the completed-group queue is full ({self.queue_size} groups) although the "
                                f"staleness manager granted the slot: {self.manager.stats()}") from None
        self._count(outcome)
        return outcome

    def _count(self, outcome: str) -> None:
        self.totals[outcome] += 1
        self.book.outcomes[outcome] += 1
        draws = self.book.outcomes["zero_variance"] + self.book.outcomes["failed"]
        if draws > self.max_draws:
            raise ConfigError(f"{draws} groups dropped in one step (zero variance {self.book.outcomes['zero_variance']}, "
                              f"failed {self.book.outcomes['failed']}) while collecting {self.groups_per_step} useful "
                              "ones; every group may be all-solved or all-failed. Set fully_async.zero_variance_filter "
                              "= false or sample_full_batch = false, or raise max_draws_factor", key="fully_async")

    # --- trainer side ---------------------------------------------------------------
    def batch_ready(self) -> bool:
        return self.queue.qsize() >= self.groups_per_step

    def take_batch(self) -> list[Group]:
        """``groups_per_step`` queued groups, oldest first; zero-variance ones (only queued when
        sample_full_batch is off) are dropped here. Call when :meth:`batch_ready`."""
        if not self.batch_ready():
            raise CapacityError(f"take_batch with {self.queue.qsize()} queued groups, need {self.groups_per_step}")
        taken = [self.queue.get_nowait() for _ in range(self.groups_per_step)]
        kept = [g for g in taken if not g.zero_variance]
        self.book.dropped_from_batch += len(taken) - len(kept)
        self.book.dropped_ids += [g.group_id for g in taken if g.zero_variance]
        self.book.trained += len(kept)
        self.totals["trained"] += len(kept)
        self.totals["dropped_from_batch"] += len(taken) - len(kept)
        return kept

    def advance(self) -> int:
        """After the weight sync: the next step's slots open."""
        return self.manager.advance()

    def check_budget(self) -> None:
        """CapacityError naming an inflated staleness budget (``StalenessManager.check_budget``)."""
        self.manager.check_budget()

    def queued_ids(self) -> list[str]:
        return [g.group_id for g in list(self.queue.queue)]

    def pending_ids(self, in_flight: list[str]) -> list[str]:
        """Groups generated or generating but not trained: the queue (oldest first), then ``in_flight``.
        A resume runs them again, before any new group (t1ops.campaign.group_ledger)."""
        return self.queued_ids() + [g for g in in_flight if g not in set(self.queued_ids())]

    def close_step(self) -> dict:
        """This step's group accounting for the step row; starts the next step's books."""
        b, self.book = self.book, StepBooks()
        n = b.trained + b.dropped_from_batch
        return {"groups_started": b.started, "groups_trained": b.trained,
                "groups_accepted": b.outcomes["accepted"], "groups_dropped_zero_variance":  # at settle or at batch
                b.outcomes["zero_variance"] if self.sample_full_batch else b.dropped_from_batch,
                "groups_failed": b.outcomes["failed"], "groups_dropped_ids": b.dropped_ids,
                "groups_in_flight": self.running, "groups_queued": self.queue.qsize(),
                "staleness_violations": len(b.violations),
                "violation_lags": sorted(v.staleness for v in b.violations),
                "violation_share": len(b.violations) / n if n else 0.0}

    def books(self) -> dict:
        """Run totals; ``balanced``: every submitted group is settled or still running/queued."""
        t = {k: self.totals.get(k, 0) for k in ("submitted", *OUTCOMES, "trained", "dropped_from_batch",
                                                  "violations")}
        settled = sum(t.get(k, 0) for k in OUTCOMES)
        t.update(running=self.running, queued=self.queue.qsize(),
                 balanced=t.get("submitted", 0) == settled + self.running)
        return t


def version_lag_histogram(results: list[TrialResult], trainer_version: int) -> dict[int, int]:
    """Loss-bearing tokens by version lag (``trainer_version - policy_version``) over a batch."""
    hist: Counter = Counter()
    for r in results:
        for version, n in versions_of(r).items():
            hist[trainer_version - version] += n
    return dict(sorted(hist.items()))


def spans_versions(result: TrialResult) -> list[int]:
    """The distinct policy versions of one trajectory's sampled tokens."""
    return sorted(versions_of(result))


def max_lag(results: list[TrialResult], trainer_version: int) -> float:
    lags = [trainer_version - v for r in results for v in spans_versions(r)]
    return float(max(lags)) if lags else math.nan
