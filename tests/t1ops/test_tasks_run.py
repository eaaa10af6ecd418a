"""`t1ops tasks run` end to end on Harbor-style fixtures: oracle rewards, no-verdict, not-run,
the task's own memory limit, and an imported older-layout task."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from t1ops.commands import tasks as cmd
from t1ops.task_runs import run_paths

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"


@pytest.fixture(scope="module")
def oracle_rows(tmp_path_factory):
    rows = run_paths([FIX / "pool"], oracle=True, trials_root=tmp_path_factory.mktemp("trials"))
    return {r["task"]: r for r in rows}


def test_harbor_tasks_that_run_locally_get_full_reward_from_their_own_verdict(oracle_rows):
    hello, count = oracle_rows["hello-app"], oracle_rows["count-words"]
    assert (hello["source"], hello["passed"], hello["total"], hello["solved"]) == ("ctrf", 4, 4, True)
    assert (count["source"], count["reward"], count["solved"]) == ("harbor-reward", 1.0, True)
    assert hello["reason"] == count["reason"] == "ok"


def test_a_script_that_exits_0_without_a_verdict_gets_0_tagged(oracle_rows):
    row = oracle_rows["exit-zero-no-verdict"]
    assert (row["reward"], row["source"], row["solved"]) == (0.0, "no-verdict", False)
    assert "never a reward" in row["reason"]


def test_a_task_needing_a_container_is_not_run_and_says_which_line(oracle_rows):
    row = oracle_rows["needs-container"]
    assert (row["reward"], row["source"]) == (None, "not-run")
    assert row["reason"].startswith("needs a container runtime (line 3: RUN apt-get")


def test_the_task_memory_mb_is_the_limit_it_runs_under(oracle_rows, tmp_path):
    row = oracle_rows["memory-bound"]            # declares 256 MB, needs ~600 MB
    assert row["reason"].startswith("solution memory_limit") and row["reward"] == 0.0
    roomy = tmp_path / "memory-roomy"
    shutil.copytree(FIX / "pool" / "memory-bound", roomy)
    toml = roomy / "task.toml"
    toml.write_text(toml.read_text().replace("memory_mb = 256", "memory_mb = 1024"))
    [row] = run_paths([roomy], oracle=True, trials_root=tmp_path / "trials")
    assert (row["reason"], row["reward"], row["solved"]) == ("ok", 1.0, True)


def test_the_task_storage_mb_bounds_what_it_may_write(tmp_path):
    small = tmp_path / "storage-small"
    shutil.copytree(FIX / "pool" / "count-words", small)
    toml = small / "task.toml"
    toml.write_text(toml.read_text().replace('storage = "1G"', "storage_mb = 8"))
    (small / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nhead -c 32000000 /dev/zero > /app/big.bin\nwc -w < /app/words.txt > /app/count.txt\n")
    [row] = run_paths([small], oracle=True, trials_root=tmp_path / "trials")
    assert row["reason"].startswith("solution disk_limit"), row


def test_without_the_oracle_nothing_is_solved(tmp_path):
    rows = run_paths([FIX / "pool" / "hello-app", FIX / "pool" / "count-words"], oracle=False,
                     trials_root=tmp_path)
    hello, count = rows       # hello-app: only the env check passes on an untouched workspace
    assert (hello["source"], hello["passed"], hello["total"], hello["solved"]) == ("ctrf", 1, 4, False)
    assert (count["source"], count["reward"], count["solved"]) == ("harbor-reward", 0.0, False)


def test_imported_terminal_bench_task_runs_with_its_own_pytest_verdict(tmp_path):
    from t1ops.task_import import do_import
    report = do_import([FIX / "archives" / "tb-sum.tar.gz"], tmp_path / "pool")
    assert not report.refused
    [row] = run_paths([tmp_path / "pool"], oracle=True, trials_root=tmp_path / "trials")
    assert (row["source"], row["passed"], row["total"], row["solved"]) == ("ctrf", 2, 2, True)


def test_cli_json_rows_and_exit_code(tmp_path):
    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    args = p.parse_args(["run", str(FIX / "pool" / "count-words"), str(FIX / "pool" / "needs-container"),
                         "--oracle", "--json", "--trials-root", str(tmp_path)])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cmd.run(args)
    rows = json.loads(buf.getvalue())
    assert rc == 1 and [r["task"] for r in rows] == ["count-words", "needs-container"]
    for key in ("task", "reward", "source", "passed", "total", "reason", "duration_s"):
        assert all(key in r for r in rows)


def test_relative_paths_are_resolved(tmp_path, monkeypatch):
    shutil.copytree(FIX / "pool" / "count-words", tmp_path / "pool" / "count-words")
    monkeypatch.chdir(tmp_path)
    [row] = run_paths([Path("pool")], oracle=True, trials_root=Path("trials"))
    assert (row["source"], row["reward"]) == ("harbor-reward", 1.0)
    assert (tmp_path / "trials").is_dir()


def test_a_reward_file_the_tests_never_name_is_a_forgery_not_a_verdict(tmp_path):
    task = tmp_path / "pool" / "run-agent-code"
    shutil.copytree(FIX / "pool" / "count-words", task)
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n# runs a script the agent wrote, then writes the verdict itself\n"
        "if bash /app/check.sh; then echo 1 > /logs/verifier/reward.txt; "
        "else echo 0 > /logs/verifier/reward.txt; fi\nexit 0\n")
    (task / "solution" / "solve.sh").write_text(   # here the "solution" plays a forging agent
        "#!/bin/bash\nprintf '%s\\n' \"echo '{\\\"reward\\\": 1}' > /logs/verifier/reward.json\" "
        "'exit 1' > /app/check.sh\n")
    [row] = run_paths([task], oracle=True, trials_root=tmp_path / "trials")
    assert (row["source"], row["reward"]) == ("tamper:foreign-verdict", 0.0), row
