"""`t1ops chaos run --markdown/--json-out`: the CI artifacts, on self-test scenarios."""
from __future__ import annotations

import json
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.report import format_seconds
from t1ops.cli import main

PASS, MISS, CRASH = "_selftest-report-pass", "_selftest-report-miss", "_selftest-report-crash"


@register(PASS, "a scenario whose guard catches it (report self-test)")
def _pass(tmp: Path) -> Outcome:
    (tmp / "fault").write_text("x")
    tl = Timeline()  # every scenario marks its recovery (a result without it fails: test_recovery_table.py)
    tl.fault(at=0.0)
    tl.after_fault(detected=0.25, healthy=0.5)
    return Outcome(fault_fired=(tmp / "fault").exists(), unguarded="silent | loss <of> data",
                   guarded=Guarded(caught=True, detection_s=0.25, error="GuardError: caught it"),
                   invariants={"unguarded_lost_data": True, "nothing_lost": True}, details={"count": 3},
                   recovery=tl.recovery(how="in place"))


@register(MISS, "a scenario whose invariant breaks (report self-test)")
def _miss(tmp: Path) -> Outcome:
    tl = Timeline()
    tl.fault(at=0.0)
    tl.after_fault(detected=0.0004, stopped=0.001)
    return Outcome(fault_fired=True, unguarded="silent",
                   guarded=Guarded(caught=True, detection_s=0.0004, error="seen"),
                   invariants={"unguarded_lost_data": True, "nothing_lost": True, "no_duplicates": False},
                   recovery=tl.recovery(how="stopped"))


@register(CRASH, "a scenario that crashes (report self-test)")
def _crash(tmp: Path) -> Outcome:
    raise RuntimeError("scenario exploded")


def _run(tmp_path: Path, capsys) -> tuple[int, str, list[dict], str]:
    md, js = tmp_path / "out" / "chaos.md", tmp_path / "chaos.json"
    md.parent.mkdir()
    rc = main(["chaos", "run", PASS, MISS, CRASH, "--markdown", str(md), "--json-out", str(js)])
    return rc, md.read_text(), json.loads(js.read_text()), capsys.readouterr().out


def test_report_json_out_holds_every_result(tmp_path, capsys):
    rc, _, results, _ = _run(tmp_path, capsys)
    assert rc == 1  # not every scenario passed
    by_id = {r["id"]: r for r in results}
    assert list(by_id) == [PASS, MISS, CRASH]
    assert by_id[PASS]["passed"] and by_id[PASS]["guarded"]["detection_s"] == 0.25
    assert by_id[PASS]["details"] == {"count": 3} and by_id[PASS]["runbook"] == f"runbooks/{PASS}.md"
    assert not by_id[MISS]["passed"] and by_id[MISS]["invariants"]["no_duplicates"] is False
    assert "scenario exploded" in by_id[CRASH]["crashed"] and not by_id[CRASH]["fault_fired"]


def test_report_markdown_table_and_failure_sections(tmp_path, capsys):
    _, text, _, stdout = _run(tmp_path, capsys)
    lines = text.splitlines()
    header = "| id | fault fired | unguarded symptom | guarded outcome | detection | run | result |"
    assert header in lines
    rows = [line for line in lines if line.startswith("| [")]
    assert len(rows) == 3
    # the link resolves from the file's folder (tmp/out) back to the repository's runbooks/
    link = rows[0].split("](", 1)[1].split(")", 1)[0]
    repo = Path(__file__).resolve().parents[2]
    assert ((tmp_path / "out" / link).resolve().parent) == (repo / "runbooks").resolve()
    assert "silent \\| loss &lt;of&gt; data" in rows[0] and "GuardError: caught it" in rows[0]
    assert "0.25 s" in rows[0] and rows[0].endswith("| pass |")
    assert "**FAIL**: invariant broken: no_duplicates" in rows[1] and "0.4 ms" in rows[1]
    assert "crashed: RuntimeError: scenario exploded" in rows[2] and "**NO**" in rows[2]
    assert "(crashed before an outcome)" in rows[2]
    assert any(line.startswith("1/3 scenarios passed") and MISS in line for line in lines)
    assert f"## {MISS}: invariant broken: no_duplicates" in lines and f"## {CRASH}: crashed: " in text
    assert "Traceback" in text  # the crash's traceback is in the artifact
    # the terminal table says the same
    assert PASS in stdout and "1/3 scenarios passed" in stdout


def test_private_ids_are_run_only_by_name(capsys):
    assert main(["chaos", "run", "_no-such-selftest"]) == 2
    assert "unknown scenario" in capsys.readouterr().err
    assert main(["chaos", "list", "--json"]) == 0
    listed = [row["id"] for row in json.loads(capsys.readouterr().out)]
    assert PASS not in listed


def test_format_seconds():
    assert format_seconds(None) == "-"
    assert format_seconds(0.0004) == "0.4 ms"
    assert format_seconds(12.345) == "12.35 s"
