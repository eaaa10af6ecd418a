"""`t1ops runs`: status of every run under a directory, and `runs tail` following a live one (issue 55)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from t1ops.cli import main
from t1ops.runs import mark, state_of, tail

ROW = {"reward_mean": 0.25, "explained_variance": 0.1, "logprob_gap": 0.001, "turns_mean": 2.0, "tokens": 10,
       "rollout_s": 1.0, "train_s": 1.0, "step_s": 2.0, "entropy": 1.5, "actor_lr": 3e-4, "actor_grad_norm": 0.5}


def _run(root: Path, name: str, last_step: int, steps: int = 4) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"run": {"steps": steps}, "rollout": {}, "trainer": {"mode": "ppo"}}))
    rows = [{"step": s, **ROW} for s in range(1, last_step + 1)]
    (d / "summary.json").write_text(json.dumps({"steps": rows, "eval": [{"step": 0, "eval_reward_mean": 0.1}]}))
    return d


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_runs_lists_running_finished_and_crashed(tmp_path, capsys):
    done = _run(tmp_path, "tiny-1", 4)
    mark(done, "finished")
    live = _run(tmp_path, "tiny-2", 2)
    mark(live, "running")  # this process: alive
    killed = _run(tmp_path, "tiny-3", 1)
    (killed / "status.json").write_text(json.dumps({"state": "running", "pid": _dead_pid(),
                                                    "host": os.uname().nodename}))
    (tmp_path / "a-model").mkdir()
    (tmp_path / "a-model" / "config.json").write_text('{"hidden_size": 8}')  # not a run
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines()[1:] if ln.startswith("tiny")}
    assert "finished" in lines["tiny-1"] and "4/4" in lines["tiny-1"] and "0.250" in lines["tiny-1"]
    assert "running" in lines["tiny-2"] and "2/4" in lines["tiny-2"]
    assert "crashed (not resumable: no verified checkpoint)" in lines["tiny-3"] and "is gone" in lines["tiny-3"]
    assert "a-model" not in out and f"t1ops runs tail {killed}" in out


def test_runs_tail_follows_new_steps_until_the_run_ends(tmp_path):
    d = _run(tmp_path, "tiny-1", 3)
    mark(d, "running")
    out = io.StringIO()

    def sleep(_):  # the run writes step 4 and finishes while tail waits
        data = json.loads((d / "summary.json").read_text())
        data["steps"].append({"step": 4, **ROW})
        (d / "summary.json").write_text(json.dumps(data))
        mark(d, "finished")

    state = tail(d, out=out, lines=2, sleep=sleep)
    lines = out.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines if ln.startswith("step ")] == ["2", "3", "4"]
    assert lines[0].startswith("eval@0 reward 0.100") and "lr 3.0e-04" in lines[1] and "gnorm 0.50" in lines[1]
    assert lines[-1] == "tiny-1: finished at step 4/4" and state.status == "finished"


def test_legacy_run_without_status_is_judged_by_its_summary(tmp_path):
    d = _run(tmp_path, "old", 4)
    assert state_of(d).status == "finished"
