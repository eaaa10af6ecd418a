"""Held-out evaluation: the split check, its own event loop sharing the token bucket, the books."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from t1ops.campaign.evaluation import EvalTrial, Evaluator, eval_row, eval_task_names, run_on_own_loop
from t1ops.campaign.summary import Summary, plot
from t1ops.campaign.trials import BatchResult, TrialResult
from t1ops.config import CampaignConfig
from t1ops.errors import ConfigError, StallError
from t1ops.guards.pacing import TokenBucket


def _task(name: str, instruction: str | None = None):
    return SimpleNamespace(name=name, instruction=instruction or f"do {name}", family=name)


def _cfg(**eval_kw) -> CampaignConfig:
    cfg = CampaignConfig()
    for k, v in {"every_steps": 2, **eval_kw}.items():
        setattr(cfg.eval, k, v)
    return cfg


POOL = [_task(n) for n in ("a", "b", "c", "d")]


def test_eval_split_is_the_held_out_tasks():
    assert eval_task_names(_cfg(), POOL, ["a", "b"]) == ["c", "d"]
    assert eval_task_names(_cfg(tasks=["d"]), POOL, ["a", "b"]) == ["d"]


def test_eval_split_refuses_training_tasks_unknown_names_and_an_empty_split():
    with pytest.raises(ConfigError, match=r"\['b'\] are also in the training set"):
        eval_task_names(_cfg(tasks=["b", "c"]), POOL, ["a", "b"])
    with pytest.raises(ConfigError, match="not in"):
        eval_task_names(_cfg(tasks=["zz"]), POOL, ["a"])
    with pytest.raises(ConfigError, match="no held-out task"):
        eval_task_names(_cfg(), POOL, ["a", "b", "c", "d"])
    separate = [_task("x"), _task("y", instruction="do a")]  # y is training task a renamed
    with pytest.raises(ConfigError, match=r"y \(= training task a\)"):
        eval_task_names(_cfg(tasks_dir="other"), POOL, ["a"], eval_pool=separate)
    assert eval_task_names(_cfg(tasks_dir="other", tasks=["x"]), POOL, ["a"], eval_pool=separate) == ["x"]


def test_eval_schedule_warm_start_every_n_and_last():
    cfg = _cfg(every_steps=3)
    cfg.run.steps = 7
    ev = Evaluator(cfg, [object()], ["c"], lambda row: None)
    assert [s for s in range(8) if ev.due(s)] == [0, 3, 6, 7]


class _Worker:
    """The parts of RolloutWorker that the eval loop uses; trials are instant and record their loop."""

    def __init__(self, bucket) -> None:
        self.node, self.bucket = "n0", bucket
        self.settings = SimpleNamespace(rollout=SimpleNamespace(max_concurrency=4))
        self.loops: set = set()

    def _trial(self, spec, idx, cancel, *, task, agent):
        return TrialResult(task=spec.task, group_id=spec.group_id, sample_id=f"{spec.group_id}-s{spec.sample_idx}",
                           reward=1.0 if spec.sample_idx == 0 else 0.0, reward_source="ctrf", passed=1,
                           total=1 if spec.sample_idx == 0 else 2, num_turns=1, end_reason="done")


class _SingleLoopBucket:
    """The report's bug: one asyncio.Lock for the process, bound to the first loop that contends it."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            await asyncio.sleep(0.002)


def _train_and_eval(bucket, num_eval: int = 24) -> dict:
    """A 'training loop' contends the bucket while the eval runs on its own loop (as in a worker)."""
    worker = _Worker(bucket)
    trials = [EvalTrial(f"t{i // 2}", i % 2) for i in range(num_eval)]
    tasks = {t.task: _task(t.task) for t in trials}

    async def training_loop() -> dict:
        async def train_trial() -> None:
            for _ in range(10):
                await bucket.acquire()
        busy = [asyncio.ensure_future(train_trial()) for _ in range(4)]
        await asyncio.sleep(0)
        out = await run_on_own_loop(worker, 3, trials, agent=None, tasks=tasks)
        await asyncio.gather(*busy)
        return out

    return asyncio.run(training_loop())


def test_eval_on_its_own_loop_shares_the_loop_keyed_bucket_and_completes_every_trial():
    out = _train_and_eval(TokenBucket(rate_per_s=2000, burst=2))
    assert out.ledger == {"expected": 24, "completed": 24, "failed": 0, "cancelled": 0, "missing": 0}
    row = eval_row(3, [out], expected=24, eval_s=1.0, temperature=1.0)
    assert row["eval_num_trials"] == 24 and row["eval_reward_mean"] == pytest.approx(0.5)
    assert row["eval_solved_share"] == pytest.approx(0.5) and row["eval_failed"] == 0


def test_eval_with_a_single_loop_lock_names_every_failed_trial():
    out = _train_and_eval(_SingleLoopBucket())
    assert out.ledger["failed"] > 0, "the fault did not fire: no eval trial hit the foreign lock"
    assert out.ledger["completed"] + out.ledger["failed"] == 24  # none vanished
    assert any("different event loop" in e for e in out.failed.values())
    row = eval_row(3, [out], expected=24, eval_s=1.0, temperature=1.0)
    assert row["eval_failed"] == out.ledger["failed"] and row["eval_expected"] == 24


class _FailingWorker(_Worker):
    """Task t0's solving sample raises (a sandbox error on the hardest task, say)."""

    def _trial(self, spec, idx, cancel, *, task, agent):
        if spec.task == "t0" and spec.sample_idx == 0:
            raise RuntimeError("sandbox died")
        return super()._trial(spec, idx, cancel, task=task, agent=agent)


def test_the_held_out_mean_counts_a_failed_trial_at_zero_and_reports_it_beside():
    """Failed before issue 50: the mean left the failed trial out (11/23, flattering), not 11/24."""
    worker = _FailingWorker(TokenBucket(rate_per_s=2000, burst=2))
    trials = [EvalTrial(f"t{i // 2}", i % 2) for i in range(24)]
    out = asyncio.run(run_on_own_loop(worker, 3, trials, agent=None, tasks={t.task: _task(t.task) for t in trials}))
    row = eval_row(3, [out], expected=24, eval_s=1.0, temperature=1.0)
    assert row["eval_num_trials"] == 24 and row["eval_failed"] == 1
    assert row["eval_reward_mean"] == pytest.approx(11 / 24) and row["eval_solved_share"] == pytest.approx(11 / 24)
    assert row["eval_per_task"]["t0"] == 0.0 and row["eval_reward_sources"]["failed"] == 1


def test_eval_row_refuses_a_vanished_trial():
    books = {"expected": 3, "completed": 2, "failed": 0, "cancelled": 0, "missing": 0}
    out = BatchResult(results=[], failed={}, node="n0", ledger=books)
    with pytest.raises(StallError, match="vanished"):
        eval_row(1, [out], expected=3, eval_s=0.1, temperature=0.0)
    with pytest.raises(StallError, match="vanished"):
        eval_row(1, [BatchResult(results=[], failed={}, node="n0", ledger={**books, "expected": 2})], expected=3,
                 eval_s=0.1, temperature=0.0)


def test_eval_rows_in_summary_json_and_report(tmp_path: Path):
    s = Summary(tmp_path, "r", {})
    base = {"reward_mean": 0.3, "explained_variance": 0.1, "logprob_gap": 0.01, "turns_mean": 1.0, "tokens": 5,
            "rollout_s": 1.0, "train_s": 1.0, "step_s": 2.0, "solved_share": 0.2}
    s.add_eval({"step": 0, "eval_reward_mean": 0.2, "eval_solved_share": 0.1, "eval_num_trials": 8,
                "eval_reward_sem": 0.05})
    for step in (1, 2):
        s.add_step({"step": step, **base})
    s.add_eval({"step": 2, "eval_reward_mean": 0.4, "eval_solved_share": 0.3, "eval_num_trials": 8,
                "eval_reward_sem": 0.05, "eval_per_task": {"c": 0.4}})
    data = json.loads((tmp_path / "summary.json").read_text())
    assert [e["step"] for e in data["eval"]] == [0, 2]
    assert data["steps"][1]["eval_reward_mean"] == 0.4 and "eval_reward_mean" not in data["steps"][0]
    assert "eval_per_task" not in data["steps"][1]
    assert plot(tmp_path / "summary.json").stat().st_size > 1000


def test_eval_step_line_prints_eval_reward():
    from t1ops.campaign.progress import Progress
    text = Progress.eval_text({"step": 4, "eval_reward_mean": 0.4567, "eval_solved_share": 0.25,
                               "eval_num_trials": 39, "eval_expected": 40, "eval_failed": 1})
    assert text == "eval@4 reward 0.457 solved 25% n 39/40 (1 failed)"


def test_fully_async_evaluates_the_same_held_out_split_as_the_other_modes():
    """One evaluation path for every mode: fully_async is no longer refused (or silently skipped)."""
    from t1ops.campaign.launch import held_out_tasks
    cfg = _cfg()
    cfg.rollout.num_train_tasks = 2
    split = held_out_tasks(cfg, POOL)
    cfg.run.mode = "fully_async"
    assert split and held_out_tasks(cfg, POOL) == split
