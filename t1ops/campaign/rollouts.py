"""Dispatch a step's trial groups to the rollout workers and collect them.

Groups are dealt round-robin to the workers (one per node). Collection goes
through the stall detector, fed per finished trial (workers count them): trials
in flight with none finishing for ``guards.stall_timeout_s`` is a StallError
naming the causes it can check, never an endless "collected 0/N". A MissingRoutingError raised by a worker
aborts the campaign by name (a dropped sample would bias the batch).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from t1ops import telemetry
from t1ops.campaign.worker import plan_groups
from t1ops.errors import RoutingError

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
        self._finished = [0] * len(workers)  # last progress() seen per worker
        self.num_sent = 0  # trials the workers report finished (their results sent), all steps
        stall.set_num_sent(lambda: self.num_sent)

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
        with telemetry.span("rollout.submit", step=step, num_groups=len(groups)):  # the trials' root span
            carrier = telemetry.trace_carrier()
            for w, shard, share in zip(self.workers, shards, _split(accept, [len(s) for s in shards])):
                if shard:
                    refs.append(w.rollout.remote(step, shard, share, trace=carrier))
        n = sum(len(g) for g in groups)
        self.stall.on_submit(n)
        self.in_flight += n
        telemetry.gauge("rollout.in_flight", self.in_flight)
        return Pending(step, refs, n)

    def _pulse(self, check: bool = True) -> None:
        """Tell the stall detector about the workers' progress (trials they finished and sent), then
        let it judge the silence. Completions are counted where results arrive (:meth:`collect`,
        the async loop's settle), so a result lost on its way stays in flight and is named."""
        import ray

        now = ray.get([w.progress.remote() for w in self.workers])
        for i, n in enumerate(now):
            delta = n - self._finished[i] if n >= self._finished[i] else n  # a restarted worker counts anew
            if delta > 0:
                self.num_sent += delta
                self.stall.on_progress()
            self._finished[i] = n
        if check:
            self.stall.check()

    def pulse(self) -> None:
        """Feed finished trials to the stall detector and let it judge (the fully async loop's poll)."""
        self._pulse()

    def wait_done(self, pending: Pending) -> None:
        """Block until the batch is generated (results stay in Ray's object store)."""
        import ray

        remaining = list(pending.refs)
        while remaining:
            _, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=POLL_S)
            if remaining:
                self._pulse()
        pending.done_at = time.monotonic()

    def collect(self, pending: Pending) -> tuple[list[dict], float, dict]:
        """All results of a step, the seconds since submission, and the merged books."""
        import ray

        results, books = [], {"expected": 0, "completed": 0, "failed": 0, "cancelled": 0, "missing": 0}
        remaining = list(pending.refs)
        while remaining:
            ready, remaining = ray.wait(remaining, num_returns=1, timeout=POLL_S)
            if not ready:
                self._pulse()
                continue
            try:
                out = ray.get(ready[0])
            except ray.exceptions.RayTaskError as err:
                cause = err.as_instanceof_cause()
                if isinstance(cause, RoutingError):  # any routing error aborts (T1 report, section 05)
                    telemetry.event("rollout.aborted", severity="error", step=pending.step, reason=str(cause))
                    raise cause from None
                raise
            results += out["results"]
            self.stall.on_complete(min(out["ledger"]["expected"], self.stall.num_in_flight))
            for k in books:
                books[k] += out["ledger"][k]
        self._pulse(check=False)
        self.in_flight -= pending.num_trials
        return results, (pending.done_at or time.monotonic()) - pending.submitted_at, books


def _split(total: int, sizes: list[int]) -> list[int]:
    """Split ``total`` accepted groups over shards in proportion to their sizes (largest remainder)."""
    n = sum(sizes)
    exact = [total * k / n for k in sizes]
    out = [int(x) for x in exact]
    for i in sorted(range(len(sizes)), key=lambda i: exact[i] - out[i], reverse=True)[: total - sum(out)]:
        out[i] += 1
    return [min(o, k) for o, k in zip(out, sizes)]
