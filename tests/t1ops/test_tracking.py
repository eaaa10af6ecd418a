"""Trackers fed by the summary's row writer (t1ops/tracking; docs/tracking.md): what reaches
TensorBoard and W&B, resume without duplicated steps, and a failing tracker turned off once."""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest

from t1ops import telemetry
from t1ops.campaign.summary import Summary
from t1ops.config import TrackingConfig
from t1ops.tracking import Tracker, TrackerWarning
from t1ops.tracking.scalars import flat_config, scalars, section

CONFIG = {"run": {"steps": 4, "name": "t"}, "trainer": {"actor_lr": 1e-3, "clip_ratio_c": None},
          "tracking": {"tags": ["a"]}}


def _row(step: int, reward: float) -> dict:
    return {"step": step, "reward_mean": reward, "explained_variance": math.nan, "logprob_gap": 0.01,
            "turns_mean": 2.0, "tokens": 100, "rollout_s": 1.0, "train_s": 2.0, "step_s": 3.0, "mode": "sync",
            "ledger": {"missing": 0, "accepted": 8}, "engines_dead": ["e1"], "staleness_alarm": False,
            "group_lags": {"g17": 1}, "generate_share": 0.5, "eval_trial_rewards": {"task-a": [0.0, 1.0]},
            "group_ids": [3, 4, 5], "entropy": 1.2, "actor_grad_norm": 0.4, "kl_behaviour": 0.01,
            "clip_fraction": 0.1, "policy_loss": -0.02, "actor_lr": 3e-4 * step / 4}


EVAL_N = {"eval_reward_sem": 0.01, "eval_num_trials": 4}  # what every evaluation row carries


def _campaign(run_dir: Path, tracking: TrackingConfig, steps: range, *, resume_step: int | None = None,
              fire_at: int | None = None) -> Summary:
    """What run_campaign does with a tracker, without the roles: rows and evaluations through Summary."""
    telemetry.setup(run_dir)
    try:
        summary = Summary(run_dir, "run-1", CONFIG)
        summary.tracker = Tracker.open(tracking, run_dir, "run-1", CONFIG, resume_step=resume_step)
        if resume_step is None:
            summary.add_eval({"step": 0, "eval_reward_mean": 0.05, "eval_solved_share": 0.0, **EVAL_N})
        for step in steps:
            if step == fire_at:
                telemetry.event("fd.near_limit", severity="warn", open=900, limit=1024)
                telemetry.event("campaign.train_done", step=step)  # info: not a guard event
            summary.add_step(_row(step, reward=step / 10 + (0.01 if resume_step else 0.0)))
            summary.add_eval({"step": step, "eval_reward_mean": step / 20, "eval_solved_share": 0.5, **EVAL_N})
        summary.tracker.close()
    finally:
        telemetry.shutdown()
    return summary


def _tensorboard(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    acc.Reload()
    return acc


def test_row_scalars_sections_and_what_is_not_a_curve():
    values = scalars(_row(3, 0.25))
    assert values["reward/reward_mean"] == 0.25
    assert values["async/ledger/missing"] == 0 and values["async/ledger/accepted"] == 8
    assert values["engines/engines_dead"] == 1.0  # a list of slots: the curve is how many
    assert values["async/staleness_alarm"] == 0.0 and values["time/generate_share"] == 0.5
    assert "train/explained_variance" not in values  # NaN: not defined this step
    assert not any("group_ids" in k for k in values)  # identifiers: no curve (issue 55: it read 8)
    for key in ("entropy", "actor_grad_norm", "kl_behaviour", "clip_fraction", "policy_loss"):
        assert f"train/{key}" in values
    assert not any("group_lags" in k or k.endswith("/mode") or k.endswith("/step") for k in values)
    ev = scalars({"step": 2, "eval_reward_mean": 0.5, "eval_num_trials": 4, "reward_mean": 9}, keys="eval")
    assert ev == {"reward/eval_reward_mean": 0.5, "eval/eval_num_trials": 4.0}
    assert section("checkpoint_bytes") == "checkpoints" and section("violation_share") == "async"
    assert flat_config(CONFIG) == {"run.steps": 4, "run.name": "t", "trainer.actor_lr": 1e-3,
                                   "trainer.clip_ratio_c": "null", "tracking.tags": '["a"]'}


def test_tensorboard_gets_every_step_eval_guard_event_config_and_report(tmp_path):
    _campaign(tmp_path, TrackingConfig(), range(1, 4), fire_at=2)
    acc = _tensorboard(tmp_path)
    assert [(e.step, round(e.value, 3)) for e in acc.Scalars("reward/reward_mean")] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert [e.step for e in acc.Scalars("reward/eval_reward_mean")] == [0, 1, 2, 3]
    assert [e.step for e in acc.Scalars("async/ledger/missing")] == [1, 2, 3]
    (guard,) = acc.Tensors("guards/events/text_summary")  # the fd warning, at the step it fired; info events are not
    assert guard.step == 2 and b"fd.near_limit" in guard.tensor_proto.string_val[0]
    assert b"train_done" not in guard.tensor_proto.string_val[0]
    assert [(e.step, e.value) for e in acc.Scalars("guards/warn_events")] == [(2, 1.0)]
    assert set(acc.PluginTagToContent("hparams")) >= {"_hparams_/experiment", "_hparams_/session_start_info"}
    assert b"actor_lr" in acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0]
    # report.png during the run (each evaluation refreshes it), not only at the end (issue 55)
    assert [e.step for e in acc.Images("report")] == [1, 2, 3]
    for key in ("entropy", "actor_grad_norm", "kl_behaviour", "clip_fraction", "policy_loss"):
        assert len(acc.Scalars(f"train/{key}")) == 3


def test_resumed_tensorboard_has_one_point_per_step(tmp_path):
    _campaign(tmp_path, TrackingConfig(), range(1, 4))         # crashed after step 3's row ...
    _campaign(tmp_path, TrackingConfig(), range(3, 5), resume_step=2)  # ... resumed from step 2's checkpoint
    acc = _tensorboard(tmp_path)
    points = [(e.step, round(e.value, 3)) for e in acc.Scalars("reward/reward_mean")]
    assert points == [(1, 0.1), (2, 0.2), (3, 0.31), (4, 0.41)]  # step 3 once: the re-run's value
    assert [e.step for e in acc.Scalars("reward/eval_reward_mean")] == [0, 1, 2, 3, 4]


def test_a_tracker_that_raises_is_turned_off_with_one_warning(tmp_path, monkeypatch):
    import torch.utils.tensorboard

    calls = []

    class Broken:  # the library's writer, failing on every call (a full disk, a dead NFS mount)
        def __init__(self, *a, **k):
            calls.append("init")

        @property
        def file_writer(self):
            return self

        def __getattr__(self, name):
            def fail(*a, **k):
                calls.append(name)
                raise OSError(28, "No space left on device")
            return fail

    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", Broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = _campaign(tmp_path, TrackingConfig(), range(1, 4))
    tracking = [w for w in caught if issubclass(w.category, TrackerWarning)]
    assert len(tracking) == 1 and "tensorboard" in str(tracking[0].message)
    assert [r["step"] for r in summary.steps] == [1, 2, 3]  # the JSON stays the truth
    assert calls == ["init", "add_summary", "close"]  # off after its first failure (close: releasing it)
    assert "OSError" in str(tracking[0].message)


def test_wandb_offline_holds_the_metrics_and_resume_appends_to_the_same_run(tmp_path):
    import json

    from t1ops.tracking.wandb_file import run_history

    offline = TrackingConfig(tensorboard=False, wandb="offline", project="t1ops-test", tags=["ci"])
    first = _campaign(tmp_path, offline, range(1, 4), fire_at=2)
    run_id = json.loads((tmp_path / "tracking.json").read_text())["wandb_run_id"]
    _campaign(tmp_path, offline, range(3, 5), resume_step=2)
    import wandb

    # run.finish() returns before wandb-core has written the session's file (seen under load: the
    # second file still lacked its run record); teardown waits for the service to finish writing
    wandb.teardown()
    files = sorted(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 2 and all(f.name == f"run-{run_id}.wandb" for f in files)  # one run, two sessions
    (id1, rows1), (id2, rows2) = run_history(files[0]), run_history(files[1])
    assert id1 == id2 == run_id
    reward = lambda rows: [(r["_step"], r["reward/reward_mean"]) for r in rows if "reward/reward_mean" in r]
    assert reward(rows1) == [(r["step"], r["reward_mean"]) for r in first.steps]  # the same numbers as summary.json
    assert [s for s, _ in reward(rows2)] == [3, 4]  # the resumed session continues at the first re-run step
    evals = [r["_step"] for r in rows1 + rows2 if "reward/eval_reward_mean" in r]
    assert evals == [0, 1, 2, 3, 3, 4]  # merged into the step's history row; re-run step 3 again
    (guard,) = [r for r in rows1 if "guards/events" in r]
    assert guard["_step"] == 2 and "fd.near_limit" in guard["guards/events"]


def test_a_failure_outside_the_trackers_turns_them_off_once(tmp_path, monkeypatch):
    from t1ops.tracking import events

    def unreadable(self):
        raise PermissionError(13, "Permission denied", str(self.root))

    monkeypatch.setattr(events.EventTail, "take", unreadable)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = _campaign(tmp_path, TrackingConfig(), range(1, 4))
    assert [str(w.message).split(" failed")[0] for w in caught if issubclass(w.category, TrackerWarning)] == \
        ["tracking: all trackers"]
    assert [r["step"] for r in summary.steps] == [1, 2, 3]
