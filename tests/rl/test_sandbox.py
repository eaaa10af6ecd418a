"""The local sandbox: layout, limits with named reasons, whole-trial kill, network, secrets.
(The red-team attacks of issue #22 are in test_sandbox_attacks.py.)"""
from __future__ import annotations

import json
import os
import shlex
import time
import uuid
from pathlib import Path

import psutil
import pytest

from rl.agent.sandbox import Limits, Sandbox, probe_isolation
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
    t = sandbox.create(load_task(TASK), 0)
    yield t
    t.close()


def _alive(uid):
    return [p for p in psutil.process_iter(["uids", "status"]) if p.info["uids"]
            and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE]


def test_trial_dir_carries_run_id_and_is_unique(sandbox):
    task = load_task(TASK)
    a, b = sandbox.create(task, 3), sandbox.create(task, 3)
    assert a.dir.parent == sandbox.root / "run-test" and a.dir != b.dir
    assert a.dir.name.startswith("files-copy-3-")
    meta = json.loads((a.dir / "trial.json").read_text())
    assert meta["run_id"] == "run-test" and meta["trial_id"] == a.trial_id
    assert (a.workspace / "data.txt").read_text() == "alpha\nbeta\ngamma\n"
    assert not (a.dir / "tests").exists() and not (a.dir / "verifier").exists()
    a.close()
    b.close()
    assert not os.path.ismount(a.dir / "fs") and not (a.workspace / "data.txt").exists()


def test_command_runs_at_app_alone_in_its_pid_namespace(trial):
    r = trial.exec("pwd; id -u; whoami; ls /proc | grep -c '^[0-9]'", timeout_s=10)
    assert r.reason == "ok" and r.exit_code == 0
    cwd, uid, name, num_pids = r.stdout.split()
    assert cwd == "/app" and int(uid) == trial.uid and int(num_pids) <= 4   # init, bash, ls, grep
    assert name == "trial"                           # tools that look the user up (git) work


def test_runaway_writer_ends_with_file_size_limit(trial):
    r = trial.exec("yes > big.txt", timeout_s=10)
    assert r.reason == "file_size_limit" and r.limit_hit
    assert (trial.workspace / "big.txt").stat().st_size <= SMALL.file_size_mb * 2**20


def test_memory_hog_ends_with_memory_limit(trial):
    r = trial.exec("python3 -c 'x = bytearray(512 * 2**20)'", timeout_s=10)
    assert r.reason == "memory_limit", r


def test_fork_bomb_ends_with_process_limit_and_leaves_nothing(trial):
    # the bomb gets 2 s to grow (a command that exits at once takes its bomb with it: the
    # PID namespace dies with the command)
    r = trial.exec(":(){ :|:& };:; sleep 2", timeout_s=10)
    assert r.reason == "process_limit", r
    assert not _alive(trial.uid)
    trial.exec(":(){ :|:& };:", timeout_s=10)
    assert not _alive(trial.uid)


def test_cpu_spinner_ends_with_cpu_limit(trial):
    r = trial.exec("while :; do :; done", timeout_s=30)
    assert r.reason == "cpu_limit", r


def test_timeout_kills_whole_process_group_including_background(trial):
    t0 = time.monotonic()
    r = trial.exec("sleep 60 & sleep 60 & sleep 60", timeout_s=1)
    assert r.reason == "timeout" and r.exit_code is None
    assert time.monotonic() - t0 < 10
    assert not _alive(trial.uid)


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


def test_no_network(sandbox, trial):
    r = trial.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '", timeout_s=10)
    assert r.stdout.split() == ["lo"]


def test_agent_cannot_write_outside_workspace(sandbox, trial):
    """Each write succeeds inside the trial (so the test can see an escape) and lands nowhere
    on the host; the marker name is fresh, so no leftover of an earlier run can hide one."""
    marker = f"t1-escape-{uuid.uuid4().hex}"
    r = trial.exec(f"for d in /tmp /var/tmp /dev/shm /app; do echo x > $d/{marker} && echo wrote $d; done; "
                   f"touch {trial.dir}/verifier {trial.dir}/{marker}; mkdir {trial.dir}/tests", timeout_s=10)
    assert r.stdout.split().count("wrote") == 4, r
    host = [Path(d) / marker for d in ("/tmp", "/var/tmp", "/dev/shm", trial.dir)]
    assert not [p for p in host if p.exists()]
    assert not (trial.dir / "verifier").exists() and not (trial.dir / "tests").exists()
    assert (trial.workspace / marker).exists() and (trial.fs / "tmp" / marker).exists()
    trial.close()
    assert not (trial.fs / "tmp" / marker).exists()     # the trial's /tmp goes with the trial


def test_finished_trial_refuses_commands(trial):
    trial.finish()
    with pytest.raises(SandboxError):
        trial.exec("true")


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(InputError):
        Limits(cpu_s=0)
    with pytest.raises(InputError):
        Sandbox(tmp_path, "../x")


def test_probe_reports_the_isolation_in_effect(tmp_path):
    iso = probe_isolation()
    assert iso.level == "strict" and iso.uid_drop and iso.cgroup, iso
    assert set(iso.namespaces) >= {"mount", "pid", "net", "ipc"}
    with pytest.raises(SandboxError, match="root"):
        Sandbox(tmp_path, "r", drop_privileges=False)
    with pytest.raises(SandboxError, match="not one of"):
        Sandbox(tmp_path, "r", isolation="paranoid")


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
    r = t.exec('echo "token=$API_TOKEN"; [ "$API_TOKEN" = sk-live-123456 ] && echo match; '
               'echo "$API_TOKEN" | rev; printf %s "$API_TOKEN" | base64; printf %s "$API_TOKEN" | xxd -p; '
               'echo "$API_TOKEN" >&2', timeout_s=10)
    assert r.stdout.startswith("token=[REDACTED:API_TOKEN]\nmatch\n")
    assert "sk-live-123456" not in r.stdout + r.stderr and "654321" not in r.stdout
    assert r.stdout.count("[REDACTED:API_TOKEN]") == 4 and "[REDACTED:API_TOKEN]" in r.stderr, r
    written = "".join(p.read_text() for p in (t.dir / "logs").iterdir()) + (t.dir / "trial.json").read_text()
    assert "sk-live-123456" not in written and "[REDACTED:API_TOKEN]" in written
    assert set(t.agent_env()) == {"PATH", "HOME", "LANG", "TMPDIR", "API_TOKEN"}
    t.close()


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
    solution = TASK / "solution" / "solve.sh"
    r = trial.exec(f"cat {solution}; ls -A {TASK.parent} | wc -l", timeout_s=10)
    assert "No such file" in r.stderr and r.stdout.strip() == "0"
    assert solution.is_file()                       # only hidden inside the agent's namespace


def test_each_trial_has_its_own_uid_and_escapees_are_swept(sandbox):
    task = load_task(TASK)
    a, b = sandbox.create(task, 7), sandbox.create(task, 8)
    assert a.uid != b.uid and a.exec("id -u").stdout.strip() == str(a.uid)
    a.exec("setsid env -i sleep 120 >/dev/null 2>&1 &", timeout_s=10)   # leaves group and marker
    time.sleep(0.1)
    alive = [p for p in psutil.process_iter(["uids", "status"]) if p.info["uids"]
             and p.info["uids"].real == a.uid and p.info["status"] != psutil.STATUS_ZOMBIE]
    assert not alive


def test_storage_is_a_sized_tmpfs_not_a_poll(tmp_path):
    sb = Sandbox(tmp_path, "run-disk", limits=Limits(storage_mb=8, file_size_mb=2, num_files=300))
    t = sb.create(load_task(TASK), 0)
    # a burst with no pause: the filesystem refuses it, nothing has to catch it in time
    r = t.exec("for i in $(seq 25); do head -c 1M /dev/zero > /dev/shm/f$i || exit 1; done", timeout_s=30)
    assert r.reason == "disk_limit" and r.limit_hit, r
    r = t.exec("rm -f /dev/shm/f*; for i in $(seq 3000); do : > /tmp/e$i || exit 1; done", timeout_s=30)
    assert r.reason == "disk_limit", r
    assert t.exec("rm -f /tmp/e*; echo ok").stdout == "ok\n"
    t.close()


def test_two_trials_of_one_task_share_no_tmp_or_logs(sandbox):
    task = load_task(TASK)
    a, b = sandbox.create(task, 11), sandbox.create(task, 12)
    mark = uuid.uuid4().hex
    assert a.exec(f"echo {mark} > /tmp/x; echo {mark} > /dev/shm/x; echo {mark} > /logs/agent/x; "
                  "cat /tmp/x /dev/shm/x /logs/agent/x").stdout.split() == [mark] * 3
    # an interpreter/venv living under /tmp (a CI checkout there) is bound read-only on top of the
    # private /tmp: its mount point is expected, nothing else is. `find` does not descend into it: a
    # venv's thousands of paths overflowed the trial's output cap, and the cut last line read as a leak.
    from rl.agent.sandbox.jail import interpreter_dirs

    prune = " ".join(f"-path {shlex.quote(d)} -prune -o" for d in interpreter_dirs())
    r = b.exec(f"cat /tmp/x /var/tmp/x /dev/shm/x /logs/agent/x; "
               f"find /tmp /var/tmp /dev/shm /logs/agent -mindepth 1 {prune} -print")
    def interpreter(line: str) -> bool:
        return any(line == d or line.startswith(d + "/") or d.startswith(line + "/") for d in interpreter_dirs())

    assert mark not in r.stdout and [ln for ln in r.stdout.split() if not interpreter(ln)] == []
    a.close()
    b.close()


def test_rlimit_fallback_without_a_cgroup_still_names_the_limit(tmp_path, monkeypatch):
    """Where no per-trial cgroup can be made the level is 'namespaces': RLIMIT_AS per process."""
    import dataclasses

    import rl.agent.sandbox as sandbox_mod

    weaker = dataclasses.replace(probe_isolation(), level="namespaces", cgroup=False,
                                 cgroup_reason="no cgroup (test)")
    monkeypatch.setattr(sandbox_mod, "probe_isolation", lambda: weaker)
    with pytest.raises(SandboxError, match="'strict' is required"):
        Sandbox(tmp_path / "a", "r")
    t = Sandbox(tmp_path / "b", "r", isolation="namespaces", limits=SMALL).create(load_task(TASK), 0)
    assert t.cgroup is None
    assert t.exec("python3 -c 'x = bytearray(512 * 2**20)'", timeout_s=20).reason == "memory_limit"
    r = t.exec("id -u; ls /proc | grep -c '^[0-9]'")
    assert r.stdout.split()[0] == str(t.uid) and int(r.stdout.split()[1]) <= 4
    t.close()


def test_an_agent_that_locks_its_own_workspace_fails_its_command_not_the_sandbox(sandbox):
    from rl.agent.verifier import verify

    t = sandbox.create(load_task(TASK), 13)
    assert t.exec("cp data.txt out.txt; chmod 000 out.txt /app").reason == "ok"
    r = t.exec("ls")
    assert (r.reason, r.exit_code) == ("exit_nonzero", 126) and "cannot enter /app" in r.stderr
    v = verify(t)                      # the verifier owns (and may read) what the agent left
    assert v.reward.passed >= 1, v
    t.close()


def test_close_all_releases_every_open_trial(tmp_path):
    sb = Sandbox(tmp_path, "run-close")
    trials = [sb.create(load_task(TASK), i) for i in range(3)]
    trials[0].close()
    assert sb.close_all() == 2
    assert not [t for t in trials if os.path.ismount(t.fs)] and all(t.closed for t in trials)


def test_release_under_frees_trials_a_dead_worker_left(tmp_path):
    from rl.agent.sandbox.trial import release_under

    t = Sandbox(tmp_path, "run-dead").create(load_task(TASK), 0)
    cg = t.cgroup.dirs
    assert os.path.ismount(t.fs) and all(d.exists() for d in cg.values())
    assert release_under(tmp_path) == 1            # as if its worker had been SIGKILLed
    assert not os.path.ismount(t.fs) and not [d for d in cg.values() if d.exists()]


def test_a_symlinked_venv_is_bound_at_its_real_path_too(tmp_path, monkeypatch):
    """A worktree's .venv linking to a checkout's venv: pytest's shebang names the real path, so
    the jail must bind it (else every verifier run exits 127: no verdict, reward 0)."""
    from rl.agent.sandbox import jail

    real = tmp_path / "checkout" / ".venv"
    real.mkdir(parents=True)
    link = tmp_path / "worktree-venv"
    link.symlink_to(real)
    monkeypatch.setattr(jail.sys, "prefix", str(link))
    dirs = jail.interpreter_dirs()
    assert str(link) in dirs and str(real) in dirs
