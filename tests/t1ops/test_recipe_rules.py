"""The documents' rules as the production path applies them (issue: every rule of the T1 report
and the SkyRL walkthrough selectable and correct). Each test failed on the code before the fix."""
from __future__ import annotations

import numpy as np
import pytest

from rl.agent.loop import AgentSettings
from rl.errors import MissingRoutingError, RoutingError
from rl.tito import Trajectory
from rl.trainer.batch import TrainBatch
from rl.trainer.settings import TrainerSettings
from rl.trainer.step import grpo_token_advantages
from t1ops.campaign.credit import assign_credit
from t1ops.campaign.reward_policy import RewardPolicy, trained_rewards
from t1ops.campaign.trials import TrialResult
from t1ops.campaign.worker import RolloutWorker, TrialSpec, WorkerSettings, task_agent
from t1ops.config import RolloutConfig, parse_config
from t1ops.errors import ConfigError
from t1ops.guards.pacing import SkimAccounting, TrialLedger


def _chunk(n_loss: int = 2, sample: str = "s") -> Trajectory:
    n = 2 + n_loss
    mask = np.array([0, 0] + [1] * n_loss, dtype=np.int8)
    return Trajectory(tokens=np.arange(1, n + 1, dtype=np.int64), loss_mask=mask,
                      rollout_logprobs=np.where(mask == 1, -0.5, 0.0).astype(np.float32),
                      engine_tokens=np.arange(1, n + 1, dtype=np.int64), origin=np.zeros(n, dtype=np.int8),
                      policy_version=np.where(mask == 1, 0, -1).astype(np.int32), routing=None,
                      meta={"sample_id": sample, "relations": ["strict"]})


def _batch(rows):
    """rows: (trajectory id, group, reward)."""
    seq = [np.arange(1, 5)] * len(rows)
    mask = [np.array([0, 0, 1, 1])] * len(rows)
    return TrainBatch.from_sequences(tokens=seq, loss_mask=mask, rollout_logprobs=[np.full(4, -0.5)] * len(rows),
                                     rewards=[r for _, _, r in rows], group_ids=[g for _, g, _ in rows],
                                     prompt_ids=[g for _, g, _ in rows], trajectory_ids=[t for t, _, _ in rows])


# --- GRPO baseline: trajectories, not chunks ------------------------------------------------
def test_grpo_baseline_counts_a_chunked_trajectory_once():
    # a solved 3-chunk trial beside a failed 1-chunk trial: +0.5 / -0.5, not +0.25 / -0.75
    adv = grpo_token_advantages(_batch([("a", "g", 1.0)] * 3 + [("b", "g", 0.0)]))
    assert adv.tolist() == [0.5, 0.5, 0.5, -0.5]


def test_grpo_baseline_only_trajectories_enter_the_group_mean():
    batch = _batch([("a", "g", 1.0), ("b", "g", 1.0)])
    batch.baseline_only = [("g", 0.0), ("g", 0.0)]  # two failed trials kept as reward 0, mask 0
    assert grpo_token_advantages(batch).tolist() == [0.5, 0.5]


# --- routing errors abort; failed trials by policy ---------------------------------------------
class _Task:
    family, max_turns = "math", None


def _worker(policy: str = "drop") -> RolloutWorker:
    w = RolloutWorker.__new__(RolloutWorker)  # _book only: no engines, sandboxes or Ray
    w.settings = WorkerSettings(agent=AgentSettings(), rollout=RolloutConfig(failed_trials=policy))
    w.tasks = {"t": _Task()}
    return w


def _book(w, outcomes):
    specs = [TrialSpec("t", "g0", i) for i in range(len(outcomes))]
    ledger = TrialLedger(name="test")
    for s in specs:
        ledger.expect(f"{s.group_id}/{s.sample_idx}")
    return w._book(outcomes, specs, ledger, SkimAccounting(), accepted=True)


@pytest.mark.parametrize("err", [RoutingError("row missing before a loss token"), MissingRoutingError("none")])
def test_any_routing_error_aborts_the_rollout(err):
    with pytest.raises(type(err)):
        _book(_worker(), [err, _result("g0-s1", 1.0, group="g0")])


def test_failed_trials_dropped_kept_as_zero_or_aborting():
    ok = _result("g0-s1", 1.0, group="g0")
    assert _book(_worker("drop"), [RuntimeError("sandbox"), ok]) == [ok]
    kept = _book(_worker("zero"), [RuntimeError("sandbox"), ok])
    assert kept[1] is ok and (kept[0].reward, kept[0].chunks, kept[0].failed) == (0.0, [], True)
    assert (kept[0].sample_id, kept[0].group_id, kept[0].error) == ("g0-s0", "g0", "RuntimeError: sandbox")
    with pytest.raises(RuntimeError, match="sandbox"):
        _book(_worker("abort"), [RuntimeError("sandbox"), ok])


def test_task_max_turns_lowers_the_rollout_ceiling_never_raises_it():
    agent = AgentSettings(max_turns=4)

    class Own:
        max_turns = 2
    assert task_agent(agent, Own()).max_turns == 2
    Own.max_turns = 9
    assert task_agent(agent, Own()).max_turns == 4 and task_agent(agent, _Task()).max_turns == 4


# --- what a trial trains on ---------------------------------------------------------------------
def _result(sample, reward, *, group="g", end="done", passed=1, total=2, turns=2, chunks=1, **kw):
    return TrialResult(sample_id=sample, group_id=group, task="t", reward=reward, passed=passed, total=total,
                       num_turns=turns, end_reason=end, chunks=[_chunk(sample=sample) for _ in range(chunks)], **kw)


def test_truncated_trial_trains_on_zero_and_overflow_clears_its_mask():
    results = [_result("a", 0.4, end="truncated"), _result("b", 0.2, end="context_exhausted"), _result("c", 0.2)]
    credit = assign_credit(results, RewardPolicy(truncated_reward_zero=True, context_overflow_clear_mask=True))
    assert credit.rewards == (0.0, 0.2) and [r.sample_id for r in credit.trials] == ["a", "c"]
    assert credit.baseline_only == (("g", 0.2),) and credit.counts.truncated_zeroed == 1
    walk = assign_credit(results, RewardPolicy())  # the report: the verifier's reward, every mask kept
    assert walk.rewards == (0.4, 0.2, 0.2) and len(walk.trials) == 3 and not walk.baseline_only


def test_binary_mode_and_length_shaping():
    results = [_result("a", 0.4, passed=2, total=2, turns=50), _result("b", 0.3, passed=1, total=2)]
    assert trained_rewards(results, RewardPolicy(mode="binary")) == [1.0, 0.0]
    shaped = trained_rewards(results, RewardPolicy(shape_length="multiplicative", shaping={"free_turns": 25.0}))
    assert shaped == pytest.approx([0.2, 0.3])  # 0.4 x 25/50; inside the free zone unchanged


def test_zero_variance_filter_outside_fully_async_drops_flat_groups():
    results = [_result("a", 1.0, group="g1"), _result("b", 1.0, group="g1"),
               _result("c", 1.0, group="g2"), _result("d", 0.0, group="g2")]
    credit = assign_credit(results, RewardPolicy(zero_variance_filter=True))
    assert [r.sample_id for r in credit.trials] == ["c", "d"] and credit.counts.zero_variance_groups_dropped == 1
    cfg = {"rollout": {"zero_variance_filter": True, "n_samples_per_prompt": 2, "batch_size": 4}}
    assert parse_config(cfg).rollout.zero_variance_filter


# --- config: DPPO deltas, TIS under fully_async, critic schedule ------------------------------------
def test_dppo_delta_low_and_high_are_separate_settings():
    cfg = parse_config({"trainer": {"mode": "grpo", "dppo_delta_low": 0.1, "dppo_delta_high": 0.3}})
    s = cfg.trainer  # the [trainer] section is the trainer's settings model (rl.trainer.settings)
    assert isinstance(s, TrainerSettings)
    assert s.dppo_deltas == (0.1, 0.3) and TrainerSettings(dppo_delta=0.2).dppo_deltas == (0.2, 0.2)


def test_tis_under_fully_async_is_refused_by_name():
    with pytest.raises(ConfigError, match="tis_mode"):
        parse_config({"run": {"mode": "fully_async"}, "trainer": {"tis_mode": "token"}})


def test_critic_schedule_keys():
    cfg = parse_config({"trainer": {"critic_warmup_steps": 2, "critic_warm_load": "runs/x/checkpoints/critic"}})
    assert (cfg.trainer.critic_warmup_steps, cfg.trainer.critic_warm_load) == (2, "runs/x/checkpoints/critic")
    with pytest.raises(ConfigError, match="critic_warm_load"):
        parse_config({"trainer": {"mode": "grpo", "critic_warm_load": "x"}})


def test_step_row_names_every_fallback_and_shows_entropy_and_critic_only(capsys):
    from t1ops.campaign.progress import Progress
    from t1ops.campaign.runner import _metrics_row
    from t1ops.campaign.trialtrace import step_split

    results = [_result("a", 1.0, reward_source="harbor-reward", reward_fallback="fallback:missing"),
               _result("b", 0.0, reward_source="no-verdict", reward_fallback="fallback:unparsable"),
               _result("c", 0.5, reward_source="ctrf", reward_fallback=None)]
    import dataclasses
    import math

    from rl.trainer.step import StepStats
    from t1ops.campaign.roles import TrainReport

    stats = StepStats(**{**{f.name: math.nan for f in dataclasses.fields(StepStats)}, "step": 1, "mode": "ppo",
                         "actor_updated": False, "num_samples": 3, "num_tokens": 6, "entropy": 1.25})
    row = _metrics_row(1, results, assign_credit(results, RewardPolicy()), TrainReport(stats=stats),
                       1.0, 1.0, 2.0, 0.1)
    assert row["reward_fallbacks"] == {"harbor-reward (fallback:missing)": 1, "no-verdict (fallback:unparsable)": 1}
    assert (row["entropy"], row["actor_updated"]) == (1.25, False)
    Progress(3, enabled=False).update(step=1, phase="done", row={**row, **step_split(results, 1.0)})
    line = capsys.readouterr().err
    assert "step 1 critic-only" in line and "entropy 1.250" in line
