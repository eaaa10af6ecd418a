"""Smoke test: `t1ops run` with trainer.parallel.dp = 2 (one Ray actor per rank, gloo)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from t1ops.config import load_toml

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_rank_campaign_runs_with_per_rank_telemetry(tmp_path):
    from t1ops.campaign.launch import run_campaign

    cfg = load_toml(REPO / "examples" / "tiny" / "campaign-dp2.toml")
    cfg.run.steps = 2
    cfg.run.num_cpus = 2
    cfg.rollout.batch_size = 4
    cfg.rollout.tasks_dir = str(REPO / "examples" / "tasks")
    cfg.trainer.warm_start_steps = 2
    run_dir = run_campaign(cfg, out_dir=str(tmp_path), show_progress=False)

    steps = json.loads((run_dir / "summary.json").read_text())["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:  # every rank trained every step and says how long it took
        assert sorted(r["rank"] for r in s["ranks"]) == [0, 1]
        assert all(r["micro_batches"] >= 1 for r in s["ranks"])
        # each dp rank fetched only its shard's trajectories (t1ops.campaign.dataplane.fetch_shard)
        a, b = (set(r["fetched"]) for r in sorted(s["ranks"], key=lambda r: r["dp_rank"]))
        assert a and b and a.isdisjoint(b) and a | b <= set(range(s["ranks"][0]["staged"]))
        assert all(0 < r["fetched_bytes"] for r in s["ranks"])
    for rank in (0, 1):
        events = (run_dir / "telemetry" / f"trainer-rank{rank}").rglob("*.jsonl")
        text = "".join(p.read_text() for p in events)
        assert "trainer.rank_joined" in text and "trainer.rank_step" in text
        assert (run_dir / "ranks" / f"rank{rank}.progress").exists()
    assert any((run_dir / "checkpoints" / "actor").iterdir())  # rank 0 published the gathered weights
