"""`t1ops chaos soak`: pass rates and detection spread under real background load."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil

from chaos import harness
from chaos.soak import background_load, soak, table_lines


def _result(sid: str, passed: bool, detection: float | None) -> harness.ScenarioResult:
    return harness.ScenarioResult(id=sid, title="t", runbook="", fault_fired=True, unguarded="u",
                                  guarded=harness.Guarded(caught=passed, detection_s=detection,
                                                          error="" if passed else "guard missed"),
                                  invariants={"unguarded_failed": True})


def test_soak_counts_pass_rate_spread_and_reasons():
    outcomes = iter([True, True, False, True, True, True])
    detections = iter([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    books = soak(["a", "b"], repeat=3, load=0,
                 run=lambda sid: _result(sid, next(outcomes), next(detections)), progress=lambda _: None)
    a, b = books
    assert (a.passed, b.passed) == ([True, False, True], [True, True, True])  # round-robin a, b, a, b, ...
    assert a.pass_rate == 2 / 3 and b.pass_rate == 1.0
    assert a.spread() == (0.1, 0.3, 0.5) and b.spread() == (0.2, 0.4, 0.6)
    assert len(a.failures) == 1 and a.failures[0].startswith("round 2:")
    text = "\n".join(table_lines(books, 3, 0))
    assert "5/6 runs passed; 1/2 scenarios at 100%" in text and "67%" in text


def test_background_load_really_burns_cpu():
    with background_load(1) as pids:
        p = psutil.Process(pids[0])
        deadline = time.monotonic() + 60
        while p.cpu_times().user < 0.2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert p.cpu_times().user >= 0.2
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE


def test_soak_command_on_a_real_scenario(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "t1ops.cli", "chaos", "soak", "dp1-incompatible",
                           "--repeat", "2", "--load", "1", "--json-out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dp1-incompatible" in proc.stdout and "2/2 runs passed" in proc.stdout
    rows = json.loads(out.read_text())
    assert rows[0]["runs"] == 2 and rows[0]["pass_rate"] == 1.0 and rows[0]["detection_s"]["max"] > 0
