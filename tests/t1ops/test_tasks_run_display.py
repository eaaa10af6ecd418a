"""`t1ops tasks run` says passed/S beside the reward and names a missing task as missing (issue 55)."""
from __future__ import annotations

from pathlib import Path

from t1ops.cli import main

TASK = Path(__file__).resolve().parents[2] / "examples" / "families" / "train" / "count-0000"  # 4 tests


def test_tasks_run_shows_passed_over_the_scale(capsys):
    assert main(["tasks", "run", str(TASK), "--oracle"]) == 0
    out, err = capsys.readouterr()
    row = out.splitlines()[1].split()
    assert row[:3] == ["count-0000", "0.200", "4/20"] and "4/4" in row  # solved, yet 0.200: S = 20
    assert "reward = passed tests / S with S = 20" in err
    assert main(["tasks", "run", str(TASK), "--oracle", "--scale", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == ["count-0000", "1.000", "4/4"]


def test_a_missing_task_directory_is_not_a_link_escape(tmp_path, capsys):
    assert main(["tasks", "run", str(tmp_path / "nope"), "--oracle"]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'nope'} does not exist" in out and "link" not in out
