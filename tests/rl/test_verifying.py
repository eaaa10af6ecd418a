"""Running verifiers are registered beside their trials and found by their run tag (slow-verifier)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from rl.agent import verifying
from rl.agent.verifier import VerifierResult, verifier_timeout_error
from rl.rewards import RewardResult


def test_an_entry_lives_while_its_verifier_runs_and_names_its_pids(tmp_path, monkeypatch):
    monkeypatch.setattr(verifying, "RESOLVE_EVERY_S", 0.01)
    tag = f"run-x/trial-{os.getpid()}-{time.monotonic_ns()}"
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                             env={**os.environ, "T1_RUN_TAG": tag}, stdout=subprocess.PIPE, text=True)
    child.stdout.readline()   # exec'd: its environment is the verifier's, not the forking parent's
    try:
        run_dir = tmp_path / "run-x"
        run_dir.mkdir()
        with verifying.Entry(run_dir, "slow-reward", "trial-1", tag, 2.0) as entry:
            assert entry.resolve() == [child.pid]
            (found,) = verifying.in_flight(tmp_path, now=entry.doc["started"] + 3.5)
            assert found["task"] == "slow-reward" and found["pids"] == [child.pid] and found["elapsed_s"] == 3.5
            line = verifying.describe(found)
            assert f"trial trial-1 (pid {child.pid}) running 3.5 s of its 2 s budget" in line
        assert verifying.in_flight(tmp_path) == []            # gone when the verifier is
    finally:
        child.kill()
        child.wait()


def test_a_verifier_that_starts_late_is_still_named(tmp_path, monkeypatch):
    """On a loaded host the jail takes seconds to start: the entry keeps looking until it sees the pids
    (a single look at 0.5 s left the stall report saying "pid not yet seen" for good)."""
    monkeypatch.setattr(verifying, "RESOLVE_EVERY_S", 0.05)
    tag = f"run-y/trial-{os.getpid()}-{time.monotonic_ns()}"
    run_dir = tmp_path / "run-y"
    run_dir.mkdir()
    with verifying.Entry(run_dir, "slow-reward", "trial-2", tag, 2.0):
        time.sleep(0.3)   # six looks, nothing to see yet
        assert verifying.in_flight(tmp_path)[0]["pids"] == []
        child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                                 env={**os.environ, "T1_RUN_TAG": tag}, stdout=subprocess.PIPE, text=True)
        try:
            child.stdout.readline()
            deadline = time.monotonic() + 20
            while verifying.in_flight(tmp_path)[0]["pids"] != [child.pid]:
                assert time.monotonic() < deadline, verifying.in_flight(tmp_path)
                time.sleep(0.05)
        finally:
            child.kill()
            child.wait()
    assert verifying.in_flight(tmp_path) == []


def test_a_timed_out_verdict_becomes_an_error_naming_task_trial_pid_and_budget():
    reward = RewardResult(0.0, "no-verdict", None, None)
    v = VerifierResult("trial-1", "run/trial-1", reward, (), None, "verifier-timeout", 2.1, None, 2.0, (4242, 4243))
    err = verifier_timeout_error("slow-reward", v)
    assert isinstance(err, TimeoutError)
    assert "verifier of task slow-reward, trial trial-1 (pid 4242,4243) outlived its 2 s budget" in str(err)
    assert err.context["pids"] == [4242, 4243]
