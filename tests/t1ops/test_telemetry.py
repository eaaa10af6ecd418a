"""Telemetry writes metrics, spans and events as JSON lines in the run directory."""
from __future__ import annotations

import json
import subprocess
import sys


def test_jsonl_export(tmp_path):
    # A fresh process: OpenTelemetry providers are global and set once per process.
    code = f"""
from t1ops import telemetry
telemetry.setup({str(tmp_path)!r}, export_interval_s=60)
telemetry.count("engine.recreated", engine=1)
telemetry.gauge("fd.open", 12)
telemetry.observe("detect.latency_s", 0.5)
with telemetry.span("step", step=1):
    telemetry.event("engine.dead", severity="error", engine=1)
assert telemetry.recent_events("engine.dead")[0]["engine"] == 1
telemetry.shutdown()
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    tel = tmp_path / "telemetry"
    metrics = [json.loads(l) for l in (tel / "metrics.jsonl").read_text().splitlines() if l.strip()]
    names = {m["name"] for rec in metrics for rm in rec["resource_metrics"]
             for sm in rm["scope_metrics"] for m in sm["metrics"]}
    assert {"engine.recreated", "fd.open", "detect.latency_s", "event.engine.dead"} <= names
    spans = [json.loads(l) for l in (tel / "spans.jsonl").read_text().splitlines() if l.strip()]
    assert spans[0]["name"] == "step" and spans[0]["events"][0]["name"] == "engine.dead"
    events = [json.loads(l) for l in (tel / "events.jsonl").read_text().splitlines()]
    assert events[0]["name"] == "engine.dead"


def test_two_runs_in_one_process_write_their_own_files(tmp_path):
    # bench_pipeline and the chaos soak run several campaigns in one process: the second run's
    # spans and metrics must land in its own files, and nothing may write to the first's closed ones.
    code = f"""
import warnings
from t1ops import telemetry
for run in ("a", "b"):
    telemetry.setup({str(tmp_path)!r} + "/" + run, export_interval_s=60)
    telemetry.count("runs.started", run=run)
    with telemetry.span("step", run=run):
        telemetry.event("step.done", run=run)
    telemetry.shutdown()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "closed file" not in proc.stderr, proc.stderr
    for run in ("a", "b"):
        tel = tmp_path / run / "telemetry"
        spans = [json.loads(l) for l in (tel / "spans.jsonl").read_text().splitlines() if l.strip()]
        assert [s["attributes"]["run"] for s in spans] == [run]
        metrics = (tel / "metrics.jsonl").read_text()
        assert "runs.started" in metrics and f'"run": "{run}"' in metrics


def test_a_write_after_close_is_dropped_not_raised(tmp_path):
    # An exporter thread the SDK could not stop within its shutdown timeout may still write.
    from t1ops.telemetry import _RunFile

    f = _RunFile(tmp_path / "m.jsonl")
    f.write("a\n")
    f.close()
    assert f.write("late\n") == 0
    f.flush()
    assert (tmp_path / "m.jsonl").read_text() == "a\n"
