"""The per-step split of trial time, and the spans a trial leaves."""
from __future__ import annotations

import pytest

from t1ops import telemetry
from t1ops.campaign.trialtrace import TrialClock, read_trial_spans, split_text, step_split
from tests.t1ops.results import trial


def test_step_split_sums_phases_and_shares_active_trial_seconds():
    results = [trial("g-s0", queue_s=1.0, sandbox_s=1.0, generate_s=4.0, verify_s=2.0, trial_s=9.0),
               trial("g-s1", queue_s=0.0, sandbox_s=1.0, generate_s=2.0, verify_s=2.0, trial_s=6.0)]
    row = step_split(results, rollout_s=7.0)
    assert row["generate_s"] == 6.0 and row["verify_s"] == 4.0 and row["queue_s"] == 1.0
    assert row["trial_s"] == 15.0 and row["concurrency"] == 2.0       # 14 active trial-seconds in 7 s
    assert row["generate_share"] == pytest.approx(6 / 14, abs=1e-4)
    assert row["verify_share"] == pytest.approx(4 / 14, abs=1e-4)
    assert row["other_share"] == pytest.approx(2 / 14, abs=1e-4)      # 1 s per trial not in a phase
    assert row["queue_share"] == pytest.approx(1 / 15, abs=1e-4)
    assert "gen 43%" in split_text(row) and "queued 7%" in split_text(row)
    assert step_split([], 0.0)["generate_share"] == 0.0


def test_trial_spans_nest_under_the_submitting_step(tmp_path):
    telemetry.setup(tmp_path)
    try:
        with telemetry.span("rollout.submit", step=3):
            carrier = telemetry.trace_carrier()
        with telemetry.span("rollout", parent=carrier, step=3):
            clock = TrialClock()
            with telemetry.span("trial", step=3, trial_id="t-1"):
                with clock.phase("generate_s", "generate", prompt_tokens=5):
                    pass
                with clock.phase("verify_s", "verify"):
                    pass
    finally:
        telemetry.shutdown()
    spans = read_trial_spans(tmp_path)
    assert spans["t-1"]["names"] == ["generate", "verify"]
    assert spans["t-1"]["root"] == "rollout.submit" and spans["t-1"]["root_step"] == 3
    assert clock.seconds["generate_s"] >= 0 and clock.row()["trial_s"] >= 0
