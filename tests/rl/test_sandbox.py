"""The local sandbox: layout, limits with named reasons, process-group kill, network, secrets."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from rl.agent.sandbox import MARKER_ENV, Limits, Sandbox, probe_isolation
from rl.agent.secrets import RedactingFilter, collect_secrets, redact, redact_obj
from rl.agent.tasks import load_task
from rl.errors import InputError, SandboxError, TaskError

TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "files-copy"
SMALL = Limits(cpu_s=3, memory_mb=256, num_procs=24, file_size_mb=1, num_open_files=64,
               max_output_bytes=2000)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    return Sandbox(tmp_path_factory.mktemp("sbx"), "run-test", limits=SMALL)


@pytest.fixture
def trial(sandbox):
    return sandbox.create(load_task(TASK), 0)


def test_trial_dir_carries_run_id_and_is_unique(sandbox):
    task = load_task(TASK)
    a, b = sandbox.create(task, 3), sandbox.create(task, 3)
    assert a.dir.parent == sandbox.root / "run-test" and a.dir != b.dir
    assert a.dir.name.startswith("files-copy-3-")
    meta = json.loads((a.dir / "trial.json").read_text())
    assert meta["run_id"] == "run-test" and meta["trial_id"] == a.trial_id
    assert (a.workspace / "data.txt").read_text() == "alpha\nbeta\ngamma\n"
    assert not (a.dir / "tests").exists() and not (a.dir / "verifier").exists()


def test_command_runs_in_workspace_in_its_own_process_group(trial):
    r = trial.exec("pwd; ps -o pgid= -p $$; ps -o pid= -p $$", timeout_s=10)
    assert r.reason == "ok" and r.exit_code == 0
    cwd, pgid, pid = r.stdout.split()
    assert cwd == str(trial.workspace) and pgid == pid and int(pgid) != os.getpgid(0)


def test_runaway_writer_ends_with_file_size_limit(trial):
    r = trial.exec("yes > big.txt", timeout_s=10)
    assert r.reason == "file_size_limit" and r.limit_hit
    assert (trial.workspace / "big.txt").stat().st_size <= SMALL.file_size_mb * 2**20


def test_memory_hog_ends_with_memory_limit(trial):
    r = trial.exec("python3 -c 'x = bytearray(512 * 2**20)'", timeout_s=10)
    assert r.reason == "memory_limit", r


def test_fork_bomb_ends_with_process_limit_and_leaves_nothing(trial):
    r = trial.exec(":(){ :|:& };:", timeout_s=5)
    assert r.reason == "process_limit", r
    time.sleep(0.2)
    left = [p for p in psutil.process_iter(["pid"]) if _has_marker(p, trial.trial_id)]
    assert not left


def _has_marker(proc, marker):
    try:
        return proc.environ().get(MARKER_ENV) == marker
    except (psutil.Error, OSError):
        return False


def test_cpu_spinner_ends_with_cpu_limit(trial):
    r = trial.exec("while :; do :; done", timeout_s=30)
    assert r.reason == "cpu_limit", r


def test_timeout_kills_whole_process_group_including_background(trial):
    t0 = time.monotonic()
    r = trial.exec("sleep 60 & sleep 60 & sleep 60", timeout_s=1)
    assert r.reason == "timeout" and r.exit_code is None
    assert time.monotonic() - t0 < 10
    assert not [p for p in psutil.process_iter(["pid"]) if _has_marker(p, trial.trial_id)]


def test_caller_continues_after_limits(trial):
    assert trial.exec("yes > big.txt", timeout_s=10).limit_hit
    assert trial.exec("cp data.txt backup.txt && echo done", timeout_s=10).stdout == "done\n"


def test_output_is_capped(trial):
    r = trial.exec("head -c 100000 /dev/zero | tr '\\0' x", timeout_s=10)
    assert r.truncated and len(r.stdout) == SMALL.max_output_bytes


def test_trial_budget_bounds_every_command(sandbox):
    t = sandbox.create(load_task(TASK), 1)
    object.__setattr__(t, "budget", type(t.budget)(0.5, "task", "test"))
    r = t.exec("sleep 5", timeout_s=30)
    assert r.reason == "budget_exhausted"
    assert t.exec("true").reason == "budget_exhausted"


def test_no_network_where_kernel_allows(sandbox, trial):
    if not sandbox.isolation.network_isolated:
        pytest.skip(sandbox.isolation.network_reason)
    r = trial.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '", timeout_s=10)
    assert r.stdout.split() == ["lo"]


def test_agent_cannot_write_outside_workspace(sandbox, trial):
    if sandbox.isolation.agent_uid is None:
        pytest.skip(sandbox.isolation.uid_reason)
    r = trial.exec(f"touch {trial.dir}/verifier; mkdir {trial.dir}/tests; echo x > /tmp/t1-escape-{trial.trial_id}",
                   timeout_s=10)
    assert "Permission denied" in r.stderr
    assert not (trial.dir / "verifier").exists() and not (trial.dir / "tests").exists()


def test_finished_trial_refuses_commands(trial):
    trial.finish()
    with pytest.raises(SandboxError):
        trial.exec("true")


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(InputError):
        Limits(cpu_s=0)
    with pytest.raises(InputError):
        Sandbox(tmp_path, "../x")


def test_probe_reports_fallback_reason_when_disabled():
    iso = probe_isolation(isolate_network=False, drop_privileges=False)
    assert not iso.network_isolated and "disabled" in iso.network_reason
    assert iso.agent_uid is None and "disabled" in iso.uid_reason


def test_secrets_reach_the_sandbox_but_not_its_output(tmp_path):
    src = tmp_path / "task"
    import shutil
    shutil.copytree(TASK, src)
    toml = (src / "task.toml").read_text().replace("required_env_keys = []",
                                                   'required_env_keys = ["API_TOKEN"]')
    (src / "task.toml").write_text(toml)
    task = load_task(src)
    with pytest.raises(TaskError, match="API_TOKEN"):
        Sandbox(tmp_path / "a", "r", environ={}).create(task, 0)
    sb = Sandbox(tmp_path / "b", "r", environ={"API_TOKEN": "sk-live-123456"})
    t = sb.create(task, 0)
    r = t.exec('echo "token=$API_TOKEN"; [ "$API_TOKEN" = sk-live-123456 ] && echo match', timeout_s=10)
    assert r.stdout == "token=[REDACTED:API_TOKEN]\nmatch\n"
    assert "sk-live-123456" not in (t.dir / "trial.json").read_text()


def test_redact_helpers():
    s = {"A": "secret-value", "B": "secret-value-longer"}
    assert redact("x secret-value-longer y secret-value", s) == "x [REDACTED:B] y [REDACTED:A]"
    assert redact_obj({"k": ["secret-value", 3]}, s) == {"k": ["[REDACTED:A]", 3]}
    with pytest.raises(TaskError):
        collect_secrets(["K"], {"K": "ab"})
    import logging
    rec = logging.LogRecord("x", logging.INFO, "f", 1, "got %s", ("secret-value",), None)
    RedactingFilter(s).filter(rec)
    assert rec.getMessage() == "got [REDACTED:A]"


def test_task_pool_is_hidden_from_the_agent(sandbox, trial):
    if not sandbox.isolation.can_hide_paths:
        pytest.skip(sandbox.isolation.hide_reason)
    solution = TASK / "solution" / "solve.sh"
    r = trial.exec(f"cat {solution}; ls -A {TASK.parent} | wc -l", timeout_s=10)
    assert "No such file" in r.stderr and r.stdout.strip() == "0"
    assert solution.is_file()                       # only hidden inside the agent's namespace


def test_each_trial_has_its_own_uid_and_escapees_are_swept(sandbox):
    if sandbox.isolation.agent_uid is None:
        pytest.skip(sandbox.isolation.uid_reason)
    task = load_task(TASK)
    a, b = sandbox.create(task, 7), sandbox.create(task, 8)
    assert a.uid != b.uid and a.exec("id -u").stdout.strip() == str(a.uid)
    a.exec("setsid env -i sleep 120 >/dev/null 2>&1 &", timeout_s=10)   # leaves group and marker
    time.sleep(0.1)
    alive = [p for p in psutil.process_iter(["uids", "status"]) if p.info["uids"]
             and p.info["uids"].real == a.uid and p.info["status"] != psutil.STATUS_ZOMBIE]
    assert not alive


def test_many_files_under_the_size_cap_end_with_disk_limit(tmp_path):
    sb = Sandbox(tmp_path, "run-disk", limits=Limits(disk_mb=8, file_size_mb=2, num_files=300))
    t = sb.create(load_task(TASK), 0)
    # The disk limit is polled (every 0.25 s): each command stays alive long enough to be seen,
    # as a real agent's command does; a burst shorter than one poll is caught by the next command.
    r = t.exec("for i in $(seq 1000); do head -c 1M /dev/zero > f$i; done; sleep 2", timeout_s=30)
    assert r.reason == "disk_limit" and r.limit_hit
    r = t.exec("rm -f f*; for i in $(seq 3000); do : > e$i; done; sleep 2", timeout_s=30)
    assert r.reason == "disk_limit"
    assert t.exec("rm -f e*; echo ok").stdout == "ok\n"
