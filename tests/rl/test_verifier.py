"""The CTRF verifier: honest rewards, partial credit, each forgery caught, stale outputs refused."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from rl.agent.sandbox import Sandbox
from rl.agent.tasks import load_task
from rl.agent.verifier import accept_ctrf, run_tag_for, verify
from rl.errors import TrialDirError

POOL = Path(__file__).resolve().parents[2] / "examples" / "tasks"
PASSING_CTRF = json.dumps({"results": {"summary": {"tests": 4, "passed": 4, "failed": 0,
                                                   "start": 1, "stop": 2},
                                       "tests": [{"name": f"t{i}", "status": "passed"} for i in range(4)]}})


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    # a private copy, so the tests-edit forgery below cannot touch the shipped pool
    dst = tmp_path_factory.mktemp("pool") / "text-sort"
    shutil.copytree(POOL / "text-sort", dst)
    return load_task(dst)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    return Sandbox(tmp_path_factory.mktemp("sbx"), "run-v")


def test_honest_solution_gets_full_ctrf_reward(sandbox, task):
    trial = sandbox.create(task, 0)
    trial.exec("sort in.txt > out.txt")
    v = verify(trial)
    assert (v.reason, v.reward.source, v.reward.passed, v.reward.total) == ("ok", "ctrf", 4, 4)
    assert v.reward.value == pytest.approx(4 / 20)
    assert not v.tamper_events and (trial.dir / "tests" / "test.sh").stat().st_mode & 0o222 == 0
    recorded = json.loads((trial.dir / "verifier" / "result.json").read_text())
    assert recorded["reason"] == "ok" and recorded["run_tag"] == run_tag_for(trial)
    with pytest.raises(TrialDirError, match="already verified"):
        verify(trial)


def test_near_miss_gets_partial_credit(sandbox, task):
    trial = sandbox.create(task, 1)
    trial.exec("cat in.txt > out.txt")      # same lines, wrong order: 2 of 4 tests
    v = verify(trial)
    assert (v.reward.source, v.reward.passed, v.reward.total) == ("ctrf", 2, 4)


def test_no_output_at_all_scores_zero_from_ctrf(sandbox, task):
    v = verify(sandbox.create(task, 2))
    assert (v.reward.source, v.reward.passed, v.reward.value) == ("ctrf", 0, 0.0)


@pytest.mark.parametrize("attack, kind", [
    ("echo '{ctrf}' > ctrf.json", "precreated-ctrf"),
    ("printf 'import pytest\\n' > conftest.py", "conftest"),
    ("mkdir -p deep/er && printf '[pytest]\\naddopts = -p evil\\n' > deep/er/pytest.ini", "pytest-config"),
    ("mkdir -p bin && printf '#!/bin/sh\\nexit 0\\n' > bin/pytest && chmod +x bin/pytest", "shadow-exec"),
    ("mkdir -p sub/_pytest && printf 'x = 1\\n' > sub/_pytest/__init__.py", "shadow-module"),
])
def test_each_workspace_forgery_is_recorded_and_never_pays(sandbox, task, attack, kind):
    trial = sandbox.create(task, 0)
    cmd = attack.format(ctrf=PASSING_CTRF)
    assert trial.exec(f"sort in.txt > out.txt; {cmd}").reason == "ok"
    v = verify(trial)
    kinds = {e.kind for e in v.tamper_events}
    assert kind in kinds and all(e.trial_id == trial.trial_id for e in v.tamper_events)
    assert v.reason == "tamper" and v.reward.source.startswith("tamper:") and kind in v.reward.source
    assert v.reward.value == 0.0
    assert json.loads((trial.dir / "verifier" / "result.json").read_text())["tamper_events"]
    trial.close()


@pytest.mark.parametrize("attack", [
    "mkdir -p {dir}/verifier && echo '{ctrf}' > {dir}/verifier/ctrf.json",
    "echo 'def test_x(): pass' > {dir}/conftest.py",
    "echo 'def test_free(): pass' >> {src}/tests/test_outputs.py",
])
def test_forgeries_outside_the_workspace_cannot_even_land(sandbox, task, tmp_path, attack):
    src = tmp_path / "task"
    shutil.copytree(task.path, src)
    before = (src / "tests" / "test_outputs.py").read_text()
    trial = sandbox.create(load_task(src), 0)
    trial.exec(attack.format(ctrf=PASSING_CTRF, dir=trial.dir, src=src))   # lands in its own /tmp at most
    assert not (trial.dir / "conftest.py").exists() and not (trial.dir / "verifier").exists()
    assert (src / "tests" / "test_outputs.py").read_text() == before
    v = verify(trial)
    assert (v.reason, v.reward.value, v.reward.passed) == ("ok", 0.0, 0)
    trial.close()


def test_stale_ctrf_from_another_run_is_refused(sandbox, task, tmp_path):
    vdir = tmp_path / "verifier"
    vdir.mkdir()
    (vdir / "run_tag").write_text("old-run/text-sort-0\n")
    (vdir / "ctrf.json").write_text(PASSING_CTRF)
    now_ms = time.time() * 1000
    with pytest.raises(TrialDirError, match="run tag"):
        accept_ctrf(vdir, "new-run/text-sort-0", now_ms - 1000, now_ms)
    (vdir / "run_tag").write_text("new-run/text-sort-0\n")      # right tag, old timestamps
    with pytest.raises(TrialDirError, match="stale"):
        accept_ctrf(vdir, "new-run/text-sort-0", now_ms - 1000, now_ms)


def _script_task(tmp_path: Path, name: str, script: str):
    src = tmp_path / name
    shutil.copytree(POOL / "files-hello", src)
    (src / "tests" / "test.sh").write_text("#!/bin/bash\n" + script)
    return load_task(src)


def test_exit_zero_without_a_verdict_scores_zero_tagged(sandbox, tmp_path):
    task = _script_task(tmp_path, "noverdict", 'test -f "$T1_WORKSPACE/out.txt"\nexit 0\n')
    trial = sandbox.create(task, 0)
    trial.exec("echo hello > out.txt")
    v = verify(trial)
    assert (v.reason, v.reward.source, v.reward.value, v.exit_code) == ("no-verdict", "no-verdict",
                                                                       0.0, 0)
    assert "never a reward" in v.reward.detail


@pytest.mark.parametrize("script, value, source", [
    ('echo 1 > "$V/reward.txt"\nexit 0\n', 1.0, "harbor-reward"),
    ('echo 0 > "$V/reward.txt"\nexit 0\n', 0.0, "harbor-reward"),
    ('echo \'{"reward": 0.5, "speed": 3}\' > "$V/reward.json"\necho 1 > "$V/reward.txt"\n', 0.5,
     "harbor-reward"),
    ('echo nonsense > "$V/reward.txt"\nexit 0\n', 0.0, "no-verdict"),
])
def test_harbor_reward_file_is_the_verdict_when_there_is_no_ctrf(sandbox, tmp_path, script,
                                                                 value, source):
    task = _script_task(tmp_path, "harbor", 'V=$(dirname "$T1_CTRF_PATH")\n' + script)
    v = verify(sandbox.create(task, 0))
    assert (v.reward.source, v.reward.value) == (source, value)


def test_a_reward_file_claiming_more_than_the_ctrf_gave_is_tampered(sandbox, tmp_path):
    task = _script_task(tmp_path, "zeroctrf", 'cd "$T1_WORKSPACE"\n'
                        'pytest -q -p no:cacheprovider --ctrf "$T1_CTRF_PATH" "$T1_TESTS_DIR"\n'
                        'echo 1 > "$(dirname "$T1_CTRF_PATH")/reward.txt"\n')
    v = verify(sandbox.create(task, 0))     # nothing done: CTRF 0 passed, reward.txt 1 (issue #28)
    assert (v.reason, v.reward.value) == ("tamper", 0.0)
    assert [e.kind for e in v.tamper_events] == ["inconsistent-verdict"]


def test_hidden_pool_blocks_the_tests_edit_outright(tmp_path, task):
    sb = Sandbox(tmp_path / "sbx", "run-hidden")
    src = tmp_path / "pool" / "text-sort"
    shutil.copytree(task.path, src)
    trial = sb.create(load_task(src), 0)
    r = trial.exec(f"echo 'def test_free(): pass' >> {src}/tests/test_outputs.py")
    assert r.reason == "exit_nonzero" and "test_free" not in (src / "tests" / "test_outputs.py").read_text()
