"""Time to recover: the harness's Timeline/Recovery, the run and soak tables, and the JSON."""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

from chaos import harness
from chaos.harness import Guarded, Outcome, Recovery, Timeline, register
from chaos.report import recovery_lines
from chaos.soak import soak, table_lines
from t1ops.cli import main

TIMED, UNTIMED = "_selftest-recovery-timed", "_selftest-recovery-untimed"
STOPPED = "_selftest-recovery-stopped"


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


@register(STOPPED, "a scenario whose guard stops the run by design (recovery self-test)")
def _stopped(tmp: Path) -> Outcome:
    tl = Timeline()
    tl.fault(at=0.0)  # a rank's own clock: the fault at its zero
    tl.after_fault(detected=0.2, stopped=0.25, healthy=None)  # a None is left unmarked
    return Outcome(fault_fired=True, unguarded="silent", guarded=Guarded(caught=True, detection_s=0.2, error="x"),
                   invariants={"unguarded_silent": True}, recovery=tl.recovery(trials_lost=1, how="stopped: XError"))


def test_timeline_measures_from_the_fault():
    rec = harness.run_scenario(TIMED).recovery
    assert rec == Recovery(detect_s=0.5, recover_s=3.0, steps_lost=2, trials_lost=7, how="resume")
    tl = Timeline()
    tl.detected(at=1.0)
    assert tl.recovery().detect_s is None  # no fault marked: nothing to measure from


def test_a_scenario_without_a_timeline_fails_and_says_so():
    res = harness.run_scenario(UNTIMED)
    rec = res.recovery
    assert rec.detect_s == 0.25 and rec.recover_s is None and rec.how == harness.NOT_MEASURED
    assert res.invariants[harness.RECOVERY_MEASURED] is False and not res.passed


def test_a_guard_that_stops_the_run_reports_when_it_stopped():
    res = harness.run_scenario(STOPPED)
    assert res.recovery == Recovery(detect_s=0.2, recover_s=None, trials_lost=1, how="stopped: XError",
                                    stopped_s=0.25)
    assert res.passed and res.invariants[harness.RECOVERY_MEASURED] is True


def test_every_catalogue_scenario_marks_its_timeline():
    """No scenario may fall back to "not measured": each builds its Outcome's recovery from a Timeline
    (running all 43 here would take an hour; the harness's RECOVERY_MEASURED invariant fails any that
    marks too little when it runs)."""
    scenarios = harness.discover()
    assert len(scenarios) >= 43
    missing = [sid for sid, sc in scenarios.items()
               if "Timeline()" not in (src := inspect.getsource(sys.modules[sc.run.__module__]))
               or "recovery=" not in inspect.getsource(sc.run) + src]
    assert not missing, f"scenarios without a recovery timeline: {missing}"


def test_run_prints_the_table_and_json_carries_it(tmp_path, capsys):
    out = tmp_path / "r.json"
    md = tmp_path / "r.md"
    assert main(["chaos", "run", TIMED, UNTIMED, STOPPED, "--json-out", str(out), "--markdown", str(md)]) == 1
    text = capsys.readouterr().out
    assert "time to recover" in text and "resume" in text and harness.NOT_MEASURED in text
    rows = {r["id"]: r for r in json.loads(out.read_text())}
    assert rows[TIMED]["recovery"] == {"detect_s": 0.5, "recover_s": 3.0, "steps_lost": 2, "trials_lost": 7,
                                       "how": "resume", "stopped_s": None}
    assert not rows[UNTIMED]["passed"] and rows[STOPPED]["passed"]
    table = md.read_text()
    assert f"| {TIMED} | 0.50 s | 3.00 s | 2 | 7 | resume |" in table
    assert f"| {UNTIMED} | 0.25 s | - | - | - | {harness.NOT_MEASURED} |" in table
    assert f"| {STOPPED} | 0.20 s | stop 0.25 s | 0 | 1 | stopped: XError |" in table


def test_soak_table_has_the_recovery_spread_and_the_losses():
    res = harness.run_scenario(TIMED)
    books = soak([TIMED], repeat=2, load=0, run=lambda sid: res, progress=lambda _: None)
    assert books[0].spread("recover_s") == (3.0, 3.0, 3.0) and books[0].to_dict()["steps_lost"] == 2
    line = next(line for line in table_lines(books, 2, 0) if line.startswith(TIMED))
    assert "3.00 s / 3.00 s / 3.00 s" in line and line.endswith("2/7")
    assert any(TIMED in line for line in recovery_lines([res]))
