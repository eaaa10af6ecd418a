"""Dispatch a step's trial groups to the rollout workers and collect them.

Groups are dealt round-robin to the workers (one per node). Collection goes
through the stall detector: work in flight with no batch arriving for
``guards.stall_timeout_s`` is a StallError naming the causes it can check,
never an endless "collected 0/N". A MissingRoutingError raised by a worker
aborts the campaign by name (a dropped sample would bias the batch).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from t1ops import telemetry
from t1ops.campaign.worker import plan_groups
from t1ops.errors import MissingRoutingError

POLL_S = 0.5


@dataclass
class Pending:
    step: int
    refs: list
    num_trials: int
    submitted_at: float = field(default_factory=time.monotonic)
    done_at: float | None = None


class Rollouts:
    def __init__(self, cfg, workers: list, task_names: list[str], stall) -> None:
        import ray

        self.cfg, self.workers, self.task_names, self.stall = cfg, workers, task_names, stall
        self.in_flight = 0
        self.pids = ray.get([w.pid.remote() for w in workers])

    def check_workers(self) -> list[int]:
        """Indices of workers Ray restarted since the last check (their rollouts were rerun)."""
        import ray

        pids = ray.get([w.pid.remote() for w in self.workers])
        restarted = [i for i, (a, b) in enumerate(zip(self.pids, pids)) if a != b]
        for i in restarted:
            telemetry.event("campaign.worker_restarted", severity="warn", worker=i, old_pid=self.pids[i],
                            new_pid=pids[i])
        self.pids = pids
        return restarted

    def submit(self, step: int) -> Pending:
        r = self.cfg.rollout
        groups, accept = plan_groups(self.task_names, step, r.batch_size, r.n_samples_per_prompt,
                                     self.cfg.run.seed, r.skim_overprovision)
        shards = [groups[i::len(self.workers)] for i in range(len(self.workers))]
        refs = []
        for w, shard in zip(self.workers, shards):
            if not shard:
                continue
            share = max(1, round(accept * len(shard) / len(groups)))
            refs.append(w.rollout.remote(step, shard, share))
        self.stall.on_submit(len(refs))
        n = sum(len(g) for g in groups)
        self.in_flight += n
        telemetry.gauge("rollout.in_flight", self.in_flight)
        return Pending(step, refs, n)

    def wait_done(self, pending: Pending) -> None:
        """Block until the batch is generated (results stay in Ray's object store)."""
        import ray

        remaining = list(pending.refs)
        while remaining:
            _, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=POLL_S)
            if remaining:
                self.stall.check()
        pending.done_at = time.monotonic()

    def collect(self, pending: Pending) -> tuple[list[dict], float, dict]:
        """All results of a step, the seconds since submission, and the merged books."""
        import ray

        results, books = [], {"expected": 0, "completed": 0, "failed": 0, "cancelled": 0, "missing": 0}
        remaining = list(pending.refs)
        while remaining:
            ready, remaining = ray.wait(remaining, num_returns=1, timeout=POLL_S)
            if not ready:
                self.stall.check()
                continue
            try:
                out = ray.get(ready[0])
            except ray.exceptions.RayTaskError as err:
                cause = err.as_instanceof_cause()
                if isinstance(cause, MissingRoutingError):
                    telemetry.event("rollout.aborted", severity="error", step=pending.step, reason=str(cause))
                    raise cause from None
                raise
            self.stall.on_complete(1)
            results += out["results"]
            for k in books:
                books[k] += out["ledger"][k]
            for tid, err in out["failed"].items():
                telemetry.event("trial.failed", severity="warn", step=pending.step, trial=tid, error=err)
        self.in_flight -= pending.num_trials
        return results, (pending.done_at or time.monotonic()) - pending.submitted_at, books
