"""Smoke test of the main job: a 2-step campaign on a two-node Ray cluster on this machine."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from t1ops.audit import audit_dump
from t1ops.campaign.trialtrace import read_trial_spans
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def two_node_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.mark.slow
def test_two_step_campaign_on_two_nodes(tmp_path, two_node_cluster):
    from t1ops.campaign.launch import run_campaign

    cfg = load_toml(REPO / "examples" / "tiny" / "campaign.toml")
    cfg.run.steps = 2
    cfg.run.ray_address = two_node_cluster.address
    cfg.rollout.num_workers = 2
    cfg.rollout.batch_size = 4
    cfg.rollout.tasks_dir = str(REPO / "examples" / "families" / "train")
    cfg.trainer.warm_start_steps = 2
    cfg.eval.tasks_dir = str(REPO / "examples" / "families" / "heldout")
    cfg.eval.every_steps, cfg.eval.tasks, cfg.eval.samples_per_task = 1, ["sum-0016", "max-0000"], 2
    run_dir = run_campaign(cfg, out_dir=str(tmp_path), show_progress=False)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [1, 2]
    assert summary["num_workers"] == 2  # one rollout worker per Ray node
    for row in summary["steps"]:
        for key in ("reward_mean", "explained_variance", "logprob_gap", "turns_mean", "tokens",
                    "rollout_s", "train_s", "step_s"):
            assert key in row
        assert row["num_trajectories"] == 4 and row["ledger"]["missing"] == 0
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


def test_refused_plan_stops_the_launch_before_any_role_starts(tmp_path):
    from t1ops.campaign.launch import run_campaign
    from t1ops.errors import PreflightRefusal

    cfg = load_toml(REPO / "examples" / "tiny" / "campaign.toml")
    cfg.run.plan = str(REPO / "examples" / "plans" / "qwen35-122b-dp1.toml")
    with pytest.raises(PreflightRefusal):
        run_campaign(cfg, out_dir=str(tmp_path), show_progress=False)
    (run_dir,) = list(tmp_path.iterdir())
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "vocab.json").exists()
