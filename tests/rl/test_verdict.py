"""The verdict rules (rl/agent/verdict.py): CTRF, then Harbor's reward files, else no-verdict."""
from __future__ import annotations

import json
import os
import time

import pytest

from rl.agent.verdict import NoReward, decide, is_solved, read_harbor_reward

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
    assert decide(CTRF_0, None, tmp_path, since_s=None, scale=20).source == "harbor-reward"
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
