"""report.png draws only the panels a run's mode produces (no empty "fully async" panel on one_step)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from t1ops.campaign import async_report
from t1ops.campaign.summary import SPLIT_TITLE, plot, report_panels

BASE = {"reward_mean": 0.3, "explained_variance": 0.1, "logprob_gap": 0.01, "turns_mean": 1.0, "tokens": 5,
        "rollout_s": 1.0, "train_s": 1.0, "step_s": 2.0, "solved_share": 0.2}
ROWS = {  # what each mode's step rows carry beyond the common keys
    "sync": {},
    "one_step": {"version_lag_tokens": {"1": 40}},
    "fully_async": {"version_lag_tokens": {"0": 10, "2": 30}, "groups_trained": 2, "groups_failed": 0,
                    "groups_dropped_zero_variance": 1, "groups_in_flight": 3, "staleness_violations": 0},
}
EXPECTED = {"sync": [], "one_step": [async_report.LAG_TITLE],
            "fully_async": [async_report.LAG_TITLE, async_report.GROUPS_TITLE]}


@pytest.mark.parametrize("mode", sorted(ROWS))
def test_panels_follow_the_mode(tmp_path: Path, mode: str) -> None:
    data = {"run_id": mode, "steps": [{"step": s, **BASE, **ROWS[mode]} for s in (1, 2)], "eval": []}
    titles = report_panels(data)
    assert titles[10] == SPLIT_TITLE and titles[11:] == EXPECTED[mode]
    assert "policy entropy (nats/token)" in titles and "actor grad norm (before clipping)" in titles
    (tmp_path / "summary.json").write_text(json.dumps(data))
    assert plot(tmp_path / "summary.json").stat().st_size > 1000
