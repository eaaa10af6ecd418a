"""Harbor task layout, task.toml validation, budgets, and the bundled pool's solutions."""
from __future__ import annotations

import logging
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rl.agent.tasks import (effective_timeout, hash_tree, inspect_task, load_pool, load_task,
                            parse_task_toml)
from rl.errors import TaskError

POOL = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def test_pool_has_24_tasks_in_several_families_with_several_tests():
    pool = load_pool(POOL)
    assert len(pool) >= 24
    families = Counter(t.family for t in pool)
    assert len(families) >= 5 and min(families.values()) >= 4
    for t in pool:
        n_tests = (t.tests_dir / "test_outputs.py").read_text().count("\ndef test_")
        assert n_tests >= 3, t.name
        assert t.solution and len(t.solution.strip().splitlines()) == 2, t.name  # shebang + one command
        assert "--ctrf" in (t.tests_dir / "test.sh").read_text()


def test_load_task_reads_fields_and_checksums_tests():
    t = load_task(POOL / "text-sort")
    assert (t.name, t.family, t.agent_timeout_s, t.verifier_timeout_s) == ("text-sort", "text", 30.0, 60.0)
    assert set(t.tests_sha256) == {"test.sh", "test_outputs.py"}
    assert t.tests_digest == hash_tree(t.tests_dir)[0]


def _copy(tmp_path: Path, name: str = "text-sort") -> Path:
    dst = tmp_path / name
    shutil.copytree(POOL / name, dst)
    return dst


@pytest.mark.parametrize("text, key", [
    ("[agent]\ntimeout_sec = 'ten'\n", "agent.timeout_sec"),
    ("[environment]\nmemory = 'lots'\n", "environment.memory"),
    ("[[steps]]\nname = 'build'\n[[steps]]\nname = 'deploy'\n", "steps"),
    ("[agent]\ntimeout_sec = -3\n", "agent.timeout_sec"),
    ("[environment]\nrequired_env_keys = ['not an id']\n", "environment.required_env_keys"),
    ("agent = 3\n", "agent"),
    ("[environment]\nallow_network = 1\n", "environment.allow_network"),
])
def test_malformed_task_toml_names_file_and_key(tmp_path, text, key):
    d = _copy(tmp_path)
    (d / "task.toml").write_text(text)
    with pytest.raises(TaskError) as err:
        load_task(d)
    assert err.value.context["key"] == key
    assert str(d / "task.toml") in str(err.value)


def test_unknown_keys_and_free_form_metadata_are_kept_and_listed_not_refused(tmp_path):
    d = _copy(tmp_path)
    (d / "task.toml").write_text(
        'schema_version = "1.1"\n[task]\nname = "org/x"\n[metadata]\nreward_type = "binary"\n'
        'family = "text"\n[agent]\ntimeout_secs = 10\nuser = "agent"\n[sandbox]\nx = 1\n'
        '[environment]\nmemory = "2G"\nstorage_mb = 300\ncpus = 2\ngpus = 0\nallow_internet = false\n'
        'mcp_servers = []\n[environment.env]\nFOO = "${HOME}"\n[verifier.env]\nMODE = "strict"\n'
        '[solution.env]\nHINT = "1"\n')
    t = load_task(d)
    assert (t.memory_mb, t.storage_mb, t.cpus, t.allow_internet) == (2048, 300, 2, False)
    assert (t.env, t.verifier_env, t.solution_env) == ({"FOO": "${HOME}"}, {"MODE": "strict"},
                                                       {"HINT": "1"})
    keys = [i.split(" ")[0] for i in t.ignored]
    assert keys == ["task", "metadata.reward_type", "agent.timeout_secs", "agent.user", "sandbox",
                    "environment.mcp_servers"]


@pytest.mark.parametrize("env, want", [
    ('network_mode = "public"', True), ('network_mode = "no-network"', False),
    ('network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]', True),
    ('network_mode = "allowlist"', False),
    ('network_mode = "public"\nallow_internet = true', True),
])
def test_harbor_network_mode_is_read_as_allow_internet(tmp_path, env, want):
    # public Harbor tasks declare network_mode, not allow_internet (seen on real pools)
    d = _copy(tmp_path)
    (d / "task.toml").write_text(f"[environment]\n{env}\n[verifier]\nnetwork_mode = 'no-network'\n")
    t = load_task(d)
    assert t.allow_internet is want
    assert not any(i.startswith("environment.network_mode") for i in t.ignored)
    assert any(i.startswith("verifier.network_mode (the verifier runs without") for i in t.ignored)


@pytest.mark.parametrize("env, words", [
    ('network_mode = "bridge"', "must be one of public, no-network, allowlist"),
    ('network_mode = "public"\nallow_internet = false', "contradicts allow_internet = false"),
])
def test_bad_network_mode_is_a_named_problem(tmp_path, env, words):
    d = _copy(tmp_path)
    (d / "task.toml").write_text(f"[environment]\n{env}\n")
    with pytest.raises(TaskError, match=words) as err:
        load_task(d)
    assert err.value.context["key"] == "environment.network_mode"


def test_every_problem_is_reported_not_only_the_first(tmp_path):
    d = _copy(tmp_path)
    (d / "task.toml").write_text("[agent]\ntimeout_sec = 'x'\n[environment]\ncpus = -1\n"
                                 "os = 'windows'\n")
    (d / "instruction.md").unlink()
    check = inspect_task(d)
    assert check.task is None and len(check.problems) == 4
    text = " ".join(check.problems)
    for word in ("instruction.md", "agent.timeout_sec", "environment.cpus", "windows"):
        assert word in text


def test_invalid_toml_syntax_and_missing_files(tmp_path):
    with pytest.raises(TaskError, match="not valid TOML"):
        parse_task_toml("[agent\n", source="x/task.toml")
    d = _copy(tmp_path)
    (d / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match="missing"):
        load_task(d)


def test_symlink_in_tests_is_refused(tmp_path):
    d = _copy(tmp_path)
    (d / "tests" / "evil").symlink_to("/etc/passwd")
    with pytest.raises(TaskError, match="link"):
        load_task(d)


def test_task_budget_wins_over_lowering_override(caplog):
    with caplog.at_level(logging.WARNING, logger="rl.agent.tasks"):
        b = effective_timeout(600.0, 300.0)
    assert (b.timeout_s, b.source) == (600.0, "task")
    assert "ignored" in b.reason and "ignored" in caplog.text


def test_override_may_raise_and_explicit_flag_may_lower(caplog):
    assert effective_timeout(60.0, 120.0).timeout_s == 120.0
    with caplog.at_level(logging.WARNING, logger="rl.agent.tasks"):
        b = effective_timeout(600.0, 300.0, allow_lower=True)
    assert (b.timeout_s, b.source) == (300.0, "override-lowered")
    assert "LOWERS" in caplog.text
    assert effective_timeout(600.0, None).source == "task"
    with pytest.raises(TaskError):
        effective_timeout(600.0, 0.0)


def test_every_solution_passes_all_its_tests(tmp_path):
    """Every bundled task's solution/solve.sh, run in the sandbox, passes every test."""
    from rl.agent.sandbox import Sandbox
    from rl.agent.verifier import verify

    sandbox = Sandbox(tmp_path, "solutions")

    def attempt(task):
        trial = sandbox.create(task, 0)
        ran = trial.exec(task.solution, timeout_s=20)
        return task.name, ran.reason, verify(trial)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(attempt, load_pool(POOL)))
    bad = [(name, ran, v.reason, v.reward) for name, ran, v in results
           if ran != "ok" or v.reason != "ok" or v.reward.passed != v.reward.total]
    assert not bad
    assert all(v.reward.source == "ctrf" and v.reward.total >= 3 for _, _, v in results)


def test_environment_env_templates_resolve_only_allowed_names(tmp_path):
    d = _copy(tmp_path)
    (d / "task.toml").write_text('[environment.env]\nAPI = "${T1_TEST_KEY}"\n'
                                 'MODE = "${T1_TEST_MODE:-fast}"\nPLAIN = "x"\n')
    t = load_task(d)
    assert t.required_env_keys == ()
    host = {"T1_TEST_KEY": "sk-secret-value", "T1_TEST_MODE": "slow"}
    allow = frozenset({"T1_TEST_KEY"})
    env, taken = t.resolved_env(host, allow)   # issue #28: T1_TEST_MODE is not allowed: unset
    assert env == {"API": "sk-secret-value", "MODE": "fast", "PLAIN": "x"}
    assert taken == {"T1_TEST_KEY": "sk-secret-value"}   # redacted like a secret by the sandbox
    env, _ = t.resolved_env(host, allow | {"T1_TEST_MODE"})
    assert env["MODE"] == "slow"
    with pytest.raises(TaskError, match="env_allow"):
        t.resolved_env(host, frozenset())              # ${T1_TEST_KEY} without default, not allowed
    with pytest.raises(TaskError, match="is not set"):
        t.resolved_env({}, allow)
