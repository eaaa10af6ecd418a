"""Smoke test of `run.mode = "fully_async"`: a short real campaign with staleness accounting."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from t1ops.audit import audit_dump
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_fully_async_campaign_accounts_every_group(tmp_path):
    from t1ops.campaign.launch import run_campaign

    cfg = load_toml(REPO / "examples" / "tiny" / "campaign-async.toml")
    assert cfg.pipeline_mode == "fully_async"
    cfg.run.steps = 3
    cfg.run.num_cpus = 2
    cfg.rollout.batch_size = 8
    cfg.rollout.tasks_dir = str(REPO / "examples" / "tasks")
    cfg.trainer.warm_start_steps = 2
    cfg.fully_async.zero_variance_filter = False  # two warm-start steps solve nothing: every group is all-zero
    run_dir = run_campaign(cfg, out_dir=str(tmp_path), show_progress=False)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [1, 2, 3]
    for row in summary["steps"]:
        assert row["mode"] == "fully_async" and row["groups_trained"] == 2 and row["num_trajectories"] == 8
        assert sum(row["version_lag_tokens"].values()) == row["tokens"]
        for key in ("groups_dropped_zero_variance", "groups_in_flight", "staleness_violations", "violation_lags"):
            assert key in row
    books = summary["async_books"]
    assert books["balanced"] and books["trained"] == 6 and books["submitted"] >= 6
    # every group handed out is trained, dropped or left at the end, none twice (docs/async.md, "Resume")
    audit = summary["group_audit"]
    assert audit["ok"] and audit["trained"] == 6 and audit["handed_out"] == books["submitted"], audit
    assert all(len(r["async_books"]["pending"]) == r["groups_in_flight"] + r["groups_queued"] for r in summary["steps"])
    assert (run_dir / "report.png").stat().st_size > 1000
    report = audit_dump(run_dir / "dumps")
    assert report.samples >= 24 and report.drift_in_loss == 0
