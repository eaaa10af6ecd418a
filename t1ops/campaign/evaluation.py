"""Held-out evaluation, concurrent with training (docs/campaign.md, "Evaluation").

The T1 report (section 09): "a single-event-loop lock silently dropped 82/89
eval tasks": the eval loop shared the sandbox token bucket with the training
loop, every eval trial crashed with "bound to a different event loop", and the
eval quietly shrank. Here the eval really runs that way, guarded:

- the coordinator's :class:`Evaluator` submits one evaluation per due step
  (0 = the warm-started weights, every ``eval.every_steps``, and the last step)
  right after the weight sync that published those weights, and collects it
  before the next sync: the eval runs while the next step trains and rolls
  out, and every eval request is served by exactly the evaluated weights;
- on each rollout worker the eval trials run on their **own event loop in
  their own thread** (:func:`run_on_own_loop`), pacing sandbox creation
  through the worker's one :class:`~t1ops.guards.pacing.TokenBucket`, the
  same object the training loop awaits (loop-keyed, so both loops can);
- every eval trial is booked in a :class:`~t1ops.guards.pacing.TrialLedger`
  and the coordinator checks expected = completed + failed over all workers:
  a trial that vanished raises; a failed one counts in the held-out mean at
  reward 0 (unsolved) and is reported beside it (``eval_failed``).

Held-out means never in the training set: :func:`eval_task_names` refuses an
overlap by name (and, for a separate pool, by instruction) before any role starts.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import ray

from t1ops import telemetry
from t1ops.campaign.trials import BatchResult, TrialResult, TrialSpec, eval_group_id, failed_row
from t1ops.errors import ConfigError, StallError
from t1ops.guards.pacing import TrialLedger

POLL_S = 0.5


@dataclass(frozen=True)
class EvalTrial:
    task: str
    sample_idx: int


# --- the held-out split ------------------------------------------------------------------
def eval_task_names(cfg, pool, train_names: list[str], eval_pool=None) -> list[str]:
    """The evaluation tasks: ``eval.tasks`` if declared, else every held-out task.

    ``pool`` is the training pool (Task objects), ``eval_pool`` the separate
    evaluation pool when ``eval.tasks_dir`` is set. Raises ConfigError naming
    the tasks when an evaluation task is also a training task, is unknown, or
    when nothing is left to evaluate.
    """
    source = eval_pool if eval_pool is not None else pool
    where = cfg.eval.tasks_dir or cfg.rollout.tasks_dir
    known = {t.name: t for t in source}
    if cfg.eval.tasks is not None:
        unknown = sorted(set(cfg.eval.tasks) - set(known))
        if unknown:
            raise ConfigError(f"eval.tasks names {unknown} that are not in {where}; known: {sorted(known)[:10]}...",
                              key="eval.tasks")
        names = sorted(set(cfg.eval.tasks))
    else:
        names = sorted(set(known) - set(train_names))
    train = set(train_names)
    overlap = sorted(set(names) & train)
    if eval_pool is not None:  # a separate pool: the same task under another name is still the same task
        train_instr = {t.instruction.strip(): t.name for t in pool if t.name in train}
        overlap += sorted(f"{n} (= training task {train_instr[known[n].instruction.strip()]})" for n in names
                          if n not in train and known[n].instruction.strip() in train_instr)
    if overlap:
        raise ConfigError(f"evaluation tasks {overlap} are also in the training set: a held-out eval never "
                          "trains on its tasks. Remove them from eval.tasks, or lower rollout.num_train_tasks.",
                          key="eval.tasks", overlap=overlap)
    if not names:
        raise ConfigError(f"no held-out task is left to evaluate: the training set takes all {len(known)} tasks "
                          f"of {where}. Set rollout.num_train_tasks below the pool size, point eval.tasks_dir "
                          "at a separate pool, or set eval.every_steps = 0.", key="eval.every_steps")
    return names


def plan_trials(names: list[str], samples_per_task: int) -> list[EvalTrial]:
    return [EvalTrial(n, s) for n in names for s in range(samples_per_task)]


# --- the worker side: its own event loop ---------------------------------------------------
async def run_on_own_loop(worker, step: int, trials: list[EvalTrial], agent, tasks: dict) -> BatchResult:
    """Run ``trials`` on a new event loop in a new thread; await the result from the caller's loop."""
    done: concurrent.futures.Future = concurrent.futures.Future()

    def main() -> None:
        try:
            done.set_result(asyncio.run(_eval_trials(worker, step, trials, agent, tasks)))
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting loop as is
            done.set_exception(err)

    threading.Thread(target=main, name=f"eval-loop-step{step}", daemon=True).start()
    return await asyncio.wrap_future(done)


async def _eval_trials(worker, step: int, trials: list[EvalTrial], agent, tasks: dict) -> BatchResult:
    """The eval loop: trials paced by the worker's shared bucket, booked in a ledger."""
    ledger = TrialLedger(name=f"eval-step{step}@{worker.node}")
    n = worker.settings.rollout.max_concurrency
    sem = asyncio.Semaphore(n)
    pool = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="eval")
    loop = asyncio.get_running_loop()

    async def one(t: EvalTrial, idx: int) -> TrialResult:
        async with sem:
            await worker.bucket.acquire()  # the bucket the training loop also awaits
            spec = TrialSpec(t.task, eval_group_id(step, t.task), t.sample_idx)
            return await loop.run_in_executor(pool, lambda: worker._trial(
                spec, idx, threading.Event(), task=tasks[t.task], agent=agent))

    ids = [f"{t.task}/{t.sample_idx}" for t in trials]
    for tid in ids:
        ledger.expect(tid)
    try:
        outs = await asyncio.gather(*(one(t, 100_000 + i) for i, t in enumerate(trials)), return_exceptions=True)
    finally:
        pool.shutdown(wait=False)
    results = []
    for t, tid, out in zip(trials, ids, outs):
        if isinstance(out, BaseException):
            ledger.fail(tid, out)
            # counted in the held-out mean at reward 0 (failures concentrate on the hardest tasks:
            # leaving them out would flatter the mean); eval_failed reports them beside it
            results.append(failed_row(TrialSpec(t.task, eval_group_id(step, t.task), t.sample_idx),
                                      tasks[t.task].family, out))
        else:
            ledger.complete(tid)
            results.append(out.replace(chunks=[], commands=[]))  # an eval trains nothing: no trajectories travel
    books = ledger.close()
    return BatchResult(results=results, ledger=books, failed=dict(ledger.failed), node=worker.node)


# --- the coordinator side -------------------------------------------------------------------
@dataclass
class _Pending:
    step: int
    refs: list
    expected: int
    submitted_at: float = field(default_factory=time.monotonic)


class Evaluator:
    """Submits due evaluations and collects them (see the module docstring)."""

    def __init__(self, cfg, workers: list, names: list[str], on_result) -> None:
        self.cfg, self.workers, self.names, self.on_result = cfg, workers, names, on_result
        e = cfg.eval
        self.trials = plan_trials(names, e.samples_per_task)
        self.temperature = 0.0 if e.greedy else e.temperature
        self.pending: _Pending | None = None
        self.latest: dict | None = None

    def due(self, step: int) -> bool:
        return step == 0 or step == self.cfg.run.steps or step % self.cfg.eval.every_steps == 0

    def maybe_submit(self, step: int) -> bool:
        """Start the evaluation of the weights published as version ``step`` (if due)."""
        if not self.due(step):
            return False
        if self.pending is not None:
            raise StallError(f"evaluation of step {self.pending.step} is still pending when step {step}'s "
                             "starts; collect() it before the weight sync")
        shards = [self.trials[i::len(self.workers)] for i in range(len(self.workers))]
        refs = [w.evaluate.remote(step, shard, self.temperature, self.cfg.eval.tasks_dir)
                for w, shard in zip(self.workers, shards) if shard]
        self.pending = _Pending(step, refs, len(self.trials))
        telemetry.event("eval.submitted", step=step, trials=len(self.trials))
        return True

    def collect(self) -> dict | None:
        """Wait for the pending evaluation (if any); check its books; hand its row to ``on_result``."""
        p = self.pending
        if p is None:
            return None
        deadline = time.monotonic() + self.cfg.eval.timeout_s
        remaining = list(p.refs)
        while remaining:
            _, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=POLL_S)
            if remaining and time.monotonic() > deadline:
                raise StallError(f"evaluation of step {p.step}: {len(remaining)}/{len(p.refs)} workers still "
                                 f"running after eval.timeout_s = {self.cfg.eval.timeout_s:.0f} s",
                                 step=p.step)
        outs = ray.get(p.refs)
        self.pending = None
        row = eval_row(p.step, outs, p.expected, time.monotonic() - p.submitted_at, self.temperature)
        self.latest = row
        self.on_result(row)
        return row


def eval_row(step: int, outs: list[BatchResult], expected: int, eval_s: float, temperature: float) -> dict:
    """Aggregate the workers' eval results; every expected trial must be accounted for."""
    books = {k: sum(o.ledger[k] for o in outs) for k in ("expected", "completed", "failed", "cancelled",
                                                             "missing")}
    if books["expected"] != expected or books["completed"] + books["failed"] != expected:
        raise StallError(f"evaluation of step {step}: {expected} trials submitted but the workers booked "
                         f"{books}; an eval trial vanished", step=step, **books)
    results = [r for o in outs for r in o.results]
    rewards = np.array([r.reward for r in results], dtype=float)
    solved = [bool(r.total) and r.passed == r.total for r in results]
    n = len(results)
    row = {"step": step, "eval_reward_mean": float(rewards.mean()) if n else math.nan,
           "eval_solved_share": float(np.mean(solved)) if n else math.nan, "eval_num_trials": n,
           "eval_expected": expected, "eval_failed": books["failed"],
           "eval_reward_sem": float(rewards.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan,
           "eval_s": round(eval_s, 3), "eval_temperature": temperature,
           "eval_per_task": _per_task(results),
           "eval_trial_rewards": _trial_rewards(results),  # per trial: `t1ops compare` groups and re-derives SEs
           "eval_reward_sources": _count(r.reward_source for r in results)}
    if books["failed"]:
        sample = next(iter(v for o in outs for v in o.failed.values()))
        telemetry.event("eval.trials_failed", severity="warn", step=step, failed=books["failed"],
                        expected=expected, sample=sample)
    telemetry.gauge("eval.reward_mean", row["eval_reward_mean"], step=step)
    return row


def _per_task(results: list[TrialResult]) -> dict:
    out: dict = {}
    for r in results:
        out.setdefault(r.task, []).append(r.reward)
    return {k: round(float(np.mean(v)), 4) for k, v in sorted(out.items())}


def _trial_rewards(results: list[TrialResult]) -> dict:
    out: dict = {}
    for r in results:
        out.setdefault(r.task, []).append(round(float(r.reward), 6))
    return dict(sorted(out.items()))


def _count(items) -> dict:
    out: dict = {}
    for it in items:
        out[it] = out.get(it, 0) + 1
    return out


def eval_agent(agent, temperature: float):
    """The worker's agent settings at the eval temperature (0: greedy)."""
    return agent.model_copy(update={"temperature": temperature})
