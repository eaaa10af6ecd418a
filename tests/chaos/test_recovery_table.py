"""Time to recover: the harness's Timeline/Recovery, the run and soak tables, and the JSON."""
from __future__ import annotations

import json
from pathlib import Path

from chaos import harness
from chaos.harness import Guarded, Outcome, Recovery, Timeline, register
from chaos.report import recovery_lines
from chaos.soak import soak, table_lines
from t1ops.cli import main

TIMED, UNTIMED = "_selftest-recovery-timed", "_selftest-recovery-untimed"


@register(TIMED, "a scenario that marks its timeline (recovery self-test)")
def _timed(tmp: Path) -> Outcome:
    tl = Timeline()
    tl.fault(at=10.0)
    tl.detected(at=10.5)
    tl.healthy(at=13.0)
    tl.healthy(at=99.0)  # the first mark of a kind counts
    return Outcome(fault_fired=True, unguarded="silent", guarded=Guarded(caught=True, detection_s=0.5, error="x"),
                   invariants={"unguarded_silent": True},
                   recovery=tl.recovery(steps_lost=2, trials_lost=7, how="resume"))


@register(UNTIMED, "a scenario with a detection time only (recovery self-test)")
def _untimed(tmp: Path) -> Outcome:
    return Outcome(fault_fired=True, unguarded="silent", guarded=Guarded(caught=True, detection_s=0.25, error="x"),
                   invariants={"unguarded_silent": True})


def test_timeline_measures_from_the_fault():
    rec = harness.run_scenario(TIMED).recovery
    assert rec == Recovery(detect_s=0.5, recover_s=3.0, steps_lost=2, trials_lost=7, how="resume")
    tl = Timeline()
    tl.detected(at=1.0)
    assert tl.recovery().detect_s is None  # no fault marked: nothing to measure from


def test_a_scenario_without_a_timeline_keeps_its_detection_and_says_recovery_was_not_measured():
    rec = harness.run_scenario(UNTIMED).recovery
    assert rec.detect_s == 0.25 and rec.recover_s is None and rec.how == "not measured"


def test_run_prints_the_table_and_json_carries_it(tmp_path, capsys):
    out = tmp_path / "r.json"
    md = tmp_path / "r.md"
    assert main(["chaos", "run", TIMED, UNTIMED, "--json-out", str(out), "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    assert "time to recover" in text and "resume" in text and "not measured" in text
    rows = {r["id"]: r for r in json.loads(out.read_text())}
    assert rows[TIMED]["recovery"] == {"detect_s": 0.5, "recover_s": 3.0, "steps_lost": 2, "trials_lost": 7,
                                       "how": "resume"}
    table = md.read_text()
    assert f"| {TIMED} | 0.50 s | 3.00 s | 2 | 7 | resume |" in table
    assert f"| {UNTIMED} | 0.25 s | - | - | - | not measured |" in table


def test_soak_table_has_the_recovery_spread_and_the_losses():
    res = harness.run_scenario(TIMED)
    books = soak([TIMED], repeat=2, load=0, run=lambda sid: res, progress=lambda _: None)
    assert books[0].spread("recover_s") == (3.0, 3.0, 3.0) and books[0].to_dict()["steps_lost"] == 2
    line = next(line for line in table_lines(books, 2, 0) if line.startswith(TIMED))
    assert "3.00 s / 3.00 s / 3.00 s" in line and line.endswith("2/7")
    assert any(TIMED in line for line in recovery_lines([res]))
