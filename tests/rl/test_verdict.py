"""The verdict rules (rl/agent/verdict.py): CTRF, then Harbor's reward files, else no-verdict."""
from __future__ import annotations

import json
import os
import time

import pytest

from rl.agent.verdict import InconsistentVerdict, NoReward, ctrf_problem, decide, is_solved, read_harbor_reward

CTRF_0 = {"results": {"summary": {"tests": 2, "passed": 0, "failed": 2},
                      "tests": [{"name": "a", "status": "failed"}, {"name": "b", "status": "failed"}]}}
CTRF_2 = {"results": {"summary": {"tests": 2, "passed": 2, "failed": 0},
                      "tests": [{"name": "a", "status": "passed"}, {"name": "b", "status": "passed"}]}}


def test_ctrf_first_then_harbor_then_no_verdict(tmp_path):
    r = decide(CTRF_2, None, tmp_path, since_s=None, scale=20)
    assert (r.source, r.passed, r.value) == ("ctrf", 2, 0.1) and is_solved(r)
    assert decide(None, "no CTRF report", tmp_path, since_s=None, scale=20).source == "no-verdict"
    (tmp_path / "reward.txt").write_text("1\n")
    r = decide(None, "no CTRF report", tmp_path, since_s=None, scale=20)
    assert (r.source, r.value) == ("harbor-reward", 1.0) and is_solved(r)
    with pytest.raises(InconsistentVerdict, match="claims more than the tests gave"):
        decide(CTRF_0, None, tmp_path, since_s=None, scale=20)   # 0/2 passed, the file says 1
    (tmp_path / "reward.txt").write_text("0\n")
    r = decide(CTRF_0, None, tmp_path, since_s=None, scale=20)
    assert (r.source, r.value, r.passed) == ("ctrf", 0.0, 0) and not is_solved(r)


@pytest.mark.parametrize("name, text", [
    ("reward.txt", "nan"), ("reward.txt", "inf"), ("reward.txt", ""), ("reward.txt", "yes"),
    ("reward.json", "[1]"), ("reward.json", '{"reward": true}'), ("reward.json", '{"score": 1}'),
    ("reward.json", "{bad json"),
])
def test_unusable_reward_files_are_no_verdict(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(NoReward):
        read_harbor_reward(tmp_path)
    r = decide(None, None, tmp_path, since_s=None, scale=20)
    assert (r.source, r.value) == ("no-verdict", 0.0)


def test_reward_json_wins_and_a_file_older_than_the_run_is_not_read(tmp_path):
    (tmp_path / "reward.json").write_text(json.dumps({"reward": 0.25, "extra": 2}))
    (tmp_path / "reward.txt").write_text("1")
    got = read_harbor_reward(tmp_path)
    assert (got.value, got.file, got.extra["extra"]) == (0.25, "reward.json", 2.0)
    old = time.time() - 3600
    for f in ("reward.json", "reward.txt"):
        os.utime(tmp_path / f, (old, old))
    with pytest.raises(NoReward, match="predates"):
        read_harbor_reward(tmp_path, since_s=time.time())


@pytest.mark.parametrize("text, kind", [("1000000", "reward-out-of-range"), ("-1", "reward-out-of-range"),
                                        ("1.5", "reward-out-of-range")])
def test_a_reward_file_outside_the_declared_range_is_inconsistent(tmp_path, text, kind):
    (tmp_path / "reward.txt").write_text(text)
    with pytest.raises(InconsistentVerdict) as e:
        decide(None, None, tmp_path, since_s=None, scale=20)
    assert e.value.kind == kind
    r = decide(None, None, tmp_path, since_s=None, scale=20, reward_range=(-2.0, 2e6))
    assert r.value == float(text)


def test_a_ctrf_report_must_name_the_tasks_own_tests(tmp_path):
    tests = {"test_outputs.py": b"import x\n\ndef test_a():\n    pass\n\nclass TestB:\n    def test_b(self):\n        pass\n"}
    ok = {"results": {"summary": {"tests": 2, "passed": 1, "failed": 1, "start": 1, "stop": 2}, "tests": [
        {"name": "test_outputs.py::test_a[1]", "status": "passed"},
        {"name": "test_outputs.py::TestB::test_b", "status": "failed"}]}}
    assert ctrf_problem(ok, tests) is None
    forged = {"results": {"summary": {"tests": 1, "passed": 1, "failed": 0, "start": 1, "stop": 2},
                          "tests": [{"name": "test_outputs.py::test_zzz", "status": "passed"}]}}
    assert "names no function" in ctrf_problem(forged, tests)
    twice = {"results": {"summary": {"tests": 2, "passed": 2, "failed": 0, "start": 1, "stop": 2},
                         "tests": [{"name": "test_outputs.py::test_a", "status": "passed"}] * 2}}
    assert "twice" in ctrf_problem(twice, tests)
    lying = {"results": {"summary": {"tests": 5, "passed": 5, "failed": 0, "start": 1, "stop": 2},
                         "tests": [{"name": "test_outputs.py::test_a", "status": "passed"}]}}
    assert "summary.tests" in ctrf_problem(lying, tests)
    unfinished = {"results": {"summary": {"tests": 0, "passed": 0, "failed": 0, "start": 1}, "tests": []}}
    assert "did not finish" in ctrf_problem(unfinished, tests)
