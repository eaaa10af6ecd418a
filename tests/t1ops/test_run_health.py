"""Run-health alarms: each fires on the degradation it names, and stays silent on a healthy run."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from rl.tito import ALIGNED, RETOKENIZED, Trajectory
from t1ops import telemetry
from t1ops.campaign.progress import Progress
from t1ops.campaign.trials import TrialResult
from t1ops.guards.field_config import RunHealthConfig
from t1ops.guards.run_health import ALARMS, THRESHOLDS, RunHealth
from t1ops.tracking.scalars import scalars


def _chunk(retokenized: int = 0) -> Trajectory:
    n, mask = 12, np.array([0] * 6 + [1] * 6, dtype=np.int8)
    origin = np.full(n, ALIGNED, dtype=np.int8)
    origin[n - retokenized:] = RETOKENIZED
    return Trajectory(tokens=np.arange(1, n + 1, dtype=np.int64), loss_mask=mask,
                      rollout_logprobs=np.zeros(n, dtype=np.float32), engine_tokens=np.zeros(n, dtype=np.int64),
                      origin=origin, policy_version=np.zeros(n, dtype=np.int32), routing=None,
                      meta={"relations": ["strict"]})


def _trials(rewards_per_group: list[list[float]], end="done", retokenized=0) -> list[TrialResult]:
    return [TrialResult(group_id=f"g{g}", task="t", sample_id=f"g{g}-s{i}", reward=r, end_reason=end,
                        chunks=[_chunk(retokenized)])
            for g, rewards in enumerate(rewards_per_group) for i, r in enumerate(rewards)]


def _row(step: int, **kw) -> dict:
    return {"step": step, "rollout_s": 10.0, "train_s": 5.0, "sync_s": 1.0, "explained_variance": 0.3,
            "logprob_gap": 0.015, "ledger": {"expected": 8, "completed": 8, "failed": 0}, "kv_cache_peak": 0.5, **kw}


HEALTHY = [[0.0, 1.0], [0.25, 0.5], [1.0, 0.0], [0.0, 0.5]]


def _run(rows_trials: list[tuple[dict, list]]) -> list[list[str]]:
    h = RunHealth(RunHealthConfig())
    return [h.check(row, trials).get("health_alarms", []) for row, trials in rows_trials]


def test_a_healthy_run_is_silent():
    fired = _run([(_row(s), _trials(HEALTHY)) for s in range(1, 8)])
    assert fired == [[]] * 7


@pytest.mark.parametrize("alarm,degraded", [
    ("health.phase-stalled", lambda s: (_row(s, rollout_s=70.0 if s == 5 else 10.0), _trials(HEALTHY))),
    ("health.aborts", lambda s: (_row(s, ledger={"expected": 8, "completed": 7, "failed": 1 if s == 5 else 0}),
                                 _trials(HEALTHY))),
    ("health.no-spread", lambda s: (_row(s), _trials([[0.0, 0.0]] * 30 + [[0.0, 1.0]] * 2 if s == 5 else HEALTHY))),
    ("health.truncated", lambda s: (_row(s), _trials(HEALTHY, end="truncated" if s == 5 else "done"))),
    ("health.kv-cache", lambda s: (_row(s, kv_cache_peak=0.95 if s == 5 else 0.5), _trials(HEALTHY))),
    ("health.ev-negative", lambda s: (_row(s, explained_variance=-0.2 if s >= 3 else 0.3), _trials(HEALTHY))),
    ("health.logprob-gap", lambda s: (_row(s, logprob_gap=0.2 if s == 5 else 0.015), _trials(HEALTHY))),
    ("health.retokenized", lambda s: (_row(s), _trials(HEALTHY, retokenized=2 if s == 5 else 0))),
    ("health.eval-shrinking", lambda s: (_row(s, eval_expected=120, eval_num_trials=89 if s == 5 else 120),
                                         _trials(HEALTHY))),
])
def test_each_alarm_fires_at_the_step_that_degrades(alarm, degraded):
    since = time.time()
    fired = _run([degraded(s) for s in range(1, 6)])
    assert [alarm in f for f in fired] == [False, False, False, False, True], fired
    events = [e for e in telemetry.recent_events(alarm, since=since)]
    assert events and events[-1]["step"] == 5


def _groups(n: int, flat: int) -> list[list[float]]:
    return [[0.0] * 4] * flat + [[0.0, 0.0, 0.25, 0.0]] * (n - flat)


def test_the_healthy_tiny_campaigns_measured_figures_stay_silent():
    """The shipped tiny campaign (8 groups of 4 per step), 2026-12-06: groups without spread per step
    0.25 0.5 0.375 0.5 0.75 0.0 (mean 0.40), EV -0.016 -0.004 -0.0008 0.005 0.011, a sub-second sync at
    5.4x its median. The per-step, EV < 0 and ratio-only definitions fired on it; these do not."""
    flat = [2, 4, 3, 4, 6, 0]
    ev = [0.0, -0.016, -0.004, -0.0008, 0.005, 0.011]
    sync = [0.5, 0.6, 0.4, 0.62, 2.3, 2.7]
    fired = _run([(_row(s + 1, explained_variance=ev[s], sync_s=sync[s]), _trials(_groups(8, flat[s])))
                  for s in range(6)])
    assert fired == [[]] * 6, fired
    collapsed = _run([(_row(s + 1), _trials(_groups(8, 8 if s >= 2 else flat[s]))) for s in range(6)])
    assert ["health.no-spread" in f for f in collapsed] == [False, False, False, True, True, True], collapsed


def test_a_critic_overshooting_for_one_step_fires_ev_negative_at_that_step():
    """Two real runs (docs/failures.md, round 4): a critic at 1000x the actor's learning rate read EV 0.0,
    -31.90, 0.0003, -0.019 and then none (reward 0); at 300x in fully async 0.0, -0.0009, -4.79, then none.
    Each overshoot is one step before the critic saturates to a constant (EV 0): the three-step streak
    never forms, and those steps' advantages were noise. The floor fires at the overshoot."""
    for ev, at in (([0.0, -31.90, 0.0003, -0.019, math.nan], 2), ([0.0, -0.0009, -4.79, math.nan, math.nan], 3)):
        fired = _run([(_row(s + 1, explained_variance=ev[s]), _trials(HEALTHY)) for s in range(5)])
        assert ["health.ev-negative" in f for f in fired] == [s + 1 == at for s in range(5)], (ev, fired)


def test_alarms_reach_the_step_line_tensorboard_and_explain(capsys):
    from t1ops.explain import explain
    h = RunHealth(RunHealthConfig())
    row = _row(1, reward_mean=0.1, entropy=1.0, turns_mean=1.0, step_s=16.0)
    row.update(h.check(row, _trials(HEALTHY, end="truncated")))
    assert row["health_alarms"] == ["health.truncated"] and row["health"]["truncated"] == 1.0
    assert scalars(row)["train/health/truncated"] == 1.0
    p = Progress(total_steps=1, enabled=False)
    p.update(step=1, phase="done", row=row)
    assert "ALARM health.truncated" in capsys.readouterr().err
    for alarm in ALARMS:
        text = explain(alarm)
        assert text.startswith(alarm) and all(k in text for k in THRESHOLDS[alarm])


def test_disabled_checks_nothing():
    h = RunHealth(RunHealthConfig(enabled=False))
    assert h.check(_row(1, logprob_gap=math.inf), _trials(HEALTHY, end="truncated")) == {}


def test_the_runner_row_through_campaign_guards(tmp_path):
    """What ``runner.take_step`` does: the row of ``_metrics_row`` through ``CampaignGuards.check_health``."""
    import dataclasses

    from rl.trainer.step import StepStats
    from t1ops.campaign.credit import assign_credit
    from t1ops.campaign.guarding import CampaignGuards
    from t1ops.campaign.reward_policy import RewardPolicy
    from t1ops.campaign.roles import TrainReport
    from t1ops.campaign.runner import _metrics_row
    from t1ops.config import CampaignConfig

    guards = CampaignGuards(CampaignConfig(), tmp_path, dead_engines=lambda: [])
    try:
        trials = _trials(HEALTHY, end="truncated")
        stats = StepStats(**{**{f.name: math.nan for f in dataclasses.fields(StepStats)}, "step": 1, "mode": "ppo",
                             "actor_updated": True, "num_samples": len(trials), "num_tokens": 6, "logprob_gap": 0.01})
        row = _metrics_row(1, trials, assign_credit(trials, RewardPolicy()), TrainReport(stats=stats),
                           1.0, 1.0, 2.0, 0.1)
        row.update(guards.check_health(row, trials))
    finally:
        guards.stop()
    assert row["health_alarms"] == ["health.truncated"] and row["health"]["logprob-gap"] == 0.01


def test_staged_results_carry_their_retokenized_share():
    """The default data plane stages chunks in the object store; the coordinator's results hold the
    counts ``dataplane.stage`` took (``loss_relations``), and the alarm reads them (it read only chunks
    before, so it never fired on a real run)."""
    from t1ops.campaign.dataplane import loss_relations

    def staged(retokenized: int) -> list:
        return [r.replace(chunks=None, loss_relations=loss_relations(r.chunks))
                for r in _trials(HEALTHY, retokenized=retokenized)]

    assert loss_relations([_chunk(2)]) == {"loss": 6, "retokenized": 2}
    fired = _run([(_row(s), staged(2 if s == 3 else 0)) for s in range(1, 4)])
    assert fired == [[], [], ["health.retokenized"]], fired


def test_an_evaluation_collected_in_a_step_reaches_eval_shrinking(tmp_path):
    """``runner.take_step`` puts the books of the evaluation it collected into the step row
    (``runner.eval_books``); the evaluation's own row never reached the alarm before."""
    from t1ops.campaign.evaluation import eval_row
    from t1ops.campaign.guarding import CampaignGuards
    from t1ops.campaign.runner import eval_books
    from t1ops.campaign.trials import BatchResult
    from t1ops.config import CampaignConfig

    scored = _trials(HEALTHY)[:5]
    out = BatchResult(results=scored, failed={f"t{i}": "VerifierTimeoutError: past 1 s" for i in range(3)}, node="n",
                      ledger={"expected": 8, "completed": 5, "failed": 3, "cancelled": 0, "missing": 0})
    evaluated = eval_row(4, [out], 8, 1.0, 1.0)
    assert eval_books(None) == {} and eval_books(evaluated) == {"eval_expected": 8, "eval_num_trials": 5,
                                                                "eval_failed": 3}
    guards = CampaignGuards(CampaignConfig(), tmp_path, dead_engines=lambda: [])
    try:
        health = guards.check_health({"step": 5, **eval_books(evaluated)}, [])
    finally:
        guards.stop()
    assert health["health_alarms"] == ["health.eval-shrinking"] and health["health"]["eval-shrinking"] == 0.625


def test_a_fully_async_step_row_carries_the_trial_ledger_aborts_reads():
    """``async_loop.step_accounting`` sums the trained groups' trial books into the row's ``ledger``
    (a fully async row had none, so health.aborts never read a figure in that mode)."""
    from t1ops.campaign.async_buffer import Group
    from t1ops.campaign.async_loop import trial_ledger
    from t1ops.campaign.trials import GroupResult

    def group(i: int, failed: int) -> Group:
        books = {"expected": 4, "completed": 4 - failed, "failed": failed, "cancelled": 0, "missing": 0}
        return Group(data=GroupResult(group_id=f"g{i}", task="t", started_step=1, results=[], ledger=books,
                                      failed={}, node="n", duration_s=1.0), started_step=1)

    ledger = trial_ledger([group(0, 0), group(1, 1)])
    assert ledger == {"expected": 8, "completed": 7, "failed": 1, "cancelled": 0, "missing": 0}
    assert _run([(_row(1, ledger=ledger), _trials(HEALTHY))]) == [["health.aborts"]]


def test_failed_eval_trials_kept_as_zeros_shrink_the_evaluation():
    """The degraded tiny campaign's evaluation at step 0 (docs/failures.md): 8 of 8 trials scored, 4 of
    them failed verifiers kept as zeros (``rollout.failed_trials = "zero"``). Counting scored trials
    alone, the alarm was silent; trials with a verdict are 4 of 8."""
    fired = _run([(_row(1, eval_expected=8, eval_num_trials=8, eval_failed=4), _trials(HEALTHY)),
                  (_row(2, eval_expected=8, eval_num_trials=8, eval_failed=0), _trials(HEALTHY))])
    assert fired == [["health.eval-shrinking"], []], fired
