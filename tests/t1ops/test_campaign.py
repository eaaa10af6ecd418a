"""Smoke test of the main job: a 2-step campaign on a two-node Ray cluster on this machine."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from t1ops.audit import audit_dump
from t1ops.campaign.trialtrace import read_trial_spans
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_step_campaign_on_two_nodes(tiny_campaign):
    run_dir = tiny_campaign.run_dir  # examples/tiny at 2 steps on two Ray nodes (tests/t1ops/conftest.py)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [1, 2]
    assert summary["num_workers"] == 2  # one rollout worker per Ray node
    for row in summary["steps"]:
        for key in ("reward_mean", "explained_variance", "logprob_gap", "turns_mean", "tokens",
                    "rollout_s", "train_s", "step_s"):
            assert key in row
        assert row["num_trajectories"] == 4 and row["ledger"]["missing"] == 0
        assert row["group_ids"] and all(g.startswith(f"st{row['step']}-") for g in row["group_ids"])
    assert summary["group_audit"]["ok"] and summary["group_audit"]["steps"] == 2  # each group trained once
    assert [e["step"] for e in summary["eval"]] == [0, 1, 2]  # warm start, every step, last
    for e in summary["eval"]:  # both workers' eval loops booked every trial
        assert e["eval_expected"] == 4 and e["eval_num_trials"] + e["eval_failed"] == 4
        assert 0 <= e["eval_reward_mean"] and 0 <= e["eval_solved_share"] <= 1
    assert summary["steps"][1]["eval_reward_mean"] == summary["eval"][2]["eval_reward_mean"]
    assert (run_dir / "report.png").stat().st_size > 1000
    assert list((run_dir / "checkpoints" / "actor").glob("step_*"))
    assert list((run_dir / "checkpoints" / "critic").glob("step_*"))
    report = audit_dump(run_dir / "dumps")
    assert report.samples >= 8 and report.loss_positions > 0 and report.drift_in_loss == 0
    assert (run_dir / "telemetry" / "events.jsonl").exists()
    for row in summary["steps"]:  # the trial-time split (docs/tracing.md)
        assert row["generate_s"] > 0 and row["verify_s"] > 0 and 0 < row["generate_share"] <= 1
    spans = read_trial_spans(run_dir)  # every trial traced: training trials under their step's rollout.submit
    train = {k: v for k, v in spans.items() if v["root"] == "rollout.submit"}
    assert len(train) == sum(r["num_trajectories"] for r in summary["steps"])
    assert len(spans) - len(train) == sum(e["eval_expected"] for e in summary["eval"])  # eval trials: own roots
    for trial in train.values():
        assert {"sandbox.create", "agent.turn", "generate", "verify", "reward"} <= set(trial["names"])
        assert trial["root"] == "rollout.submit" and trial["root_step"] == trial["step"]


@pytest.mark.slow
def test_campaign_tensorboard_files_hold_one_point_per_step(tiny_campaign):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tiny_campaign.run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    reward = [(e.step, e.value) for e in acc.Scalars("reward/reward_mean")]
    assert reward == [(r["step"], pytest.approx(r["reward_mean"])) for r in summary["steps"]]  # steps 1, 2
    evals = [(e.step, e.value) for e in acc.Scalars("reward/eval_reward_mean")]
    assert evals == [(e["step"], pytest.approx(e["eval_reward_mean"])) for e in summary["eval"]]  # 0, 1, 2
    for tag in ("train/tokens", "train/logprob_gap", "time/step_s", "time/generate_share",
                "checkpoints/checkpoint_bytes", "engines/engines_dead", "async/ledger/missing"):
        assert [e.step for e in acc.Scalars(tag)] == [1, 2], tag
    images = [e.step for e in acc.Images("report")]  # report.png, refreshed during the run (every eval, every 5 steps)
    assert images and images[-1] == 2 and images == sorted(images), images


@pytest.mark.slow
def test_campaign_with_a_raising_tracker_finishes_with_one_warning(tiny_campaign):
    assert len(tiny_campaign.tracker_warnings) == 1 and "wandb" in tiny_campaign.tracker_warnings[0]
    assert tiny_campaign.wandb_calls == ["init", "log", "finish"]  # off after the first failure
    summary = json.loads((tiny_campaign.run_dir / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [1, 2]  # JSON lines and summary.json stay the truth
    events = (tiny_campaign.run_dir / "telemetry" / "events.jsonl").read_text()
    assert events.count('"tracking.disabled"') == 1


def test_refused_plan_stops_the_launch_before_any_role_starts(tmp_path):
    from t1ops.campaign.launch import run_campaign
    from t1ops.errors import PreflightRefusal

    cfg = load_toml(REPO / "examples" / "tiny" / "campaign.toml")
    cfg.run.plan = str(REPO / "examples" / "plans" / "qwen35-122b-dp1.toml")
    with pytest.raises(PreflightRefusal):
        run_campaign(cfg, out_dir=str(tmp_path), show_progress=False)
    (run_dir,) = list(tmp_path.iterdir())
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "vocab.json").exists()
