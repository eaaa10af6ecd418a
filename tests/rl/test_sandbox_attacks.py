"""Issue #22's red-team, replayed: each attack runs for real (as root, trials under /tmp) and
the test asserts the attack's own effect did not happen. Every marker is fresh (uuid), so a
file left by an earlier run can never hide an escape; where an attack could only be judged
from the inside, the test first shows that its target really exists on the host. Every attack
runs on both environment backends (local namespaces and the podman container backend)."""
from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import threading
import uuid
from pathlib import Path

import psutil
import pytest

from rl.agent.sandbox import Limits, Sandbox
from rl.agent.tasks import load_task
from rl.agent.verifier import run_tag_for, verify

REPO = Path(__file__).resolve().parents[2]
POOL = REPO / "examples" / "tasks"


@pytest.fixture(scope="module", params=["local", "container"])
def sandbox(request, tmp_path_factory):
    """One sandbox per environment backend: every attack runs on both (docs/containers.md)."""
    if request.param == "container":
        from tests.rl.container_support import require_container_runtime

        require_container_runtime()
    root = tmp_path_factory.mktemp("attacks")
    assert str(root).startswith("/tmp/") and os.geteuid() == 0   # the exposed setting of #22
    return Sandbox(root, "run-attack", backend=request.param)


def _marker() -> str:
    return f"t1mark{uuid.uuid4().hex}"


def _task(tmp_path: Path, test_sh: str | None = None, name: str = "text-sort"):
    src = tmp_path / "pool" / name
    shutil.copytree(POOL / name, src)
    if test_sh is not None:
        (src / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    return load_task(src)


def _everything_written(trial) -> str:
    """Every byte the trial left on the host: logs, verifier outputs, trial.json."""
    out = []
    for p in trial.dir.rglob("*"):
        if p.is_file() and not p.is_symlink() and "fs" not in p.relative_to(trial.dir).parts:
            out.append(p.read_bytes().decode("utf-8", "replace"))
    return "\n".join(out)


def _host_procs_with(text: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and text in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def test_1_planted_pytest_config_above_the_trial_forges_nothing(sandbox, tmp_path):
    task = _task(tmp_path)
    trial = sandbox.create(task, 0)
    mark = _marker()
    plugin = (f"import pathlib\npathlib.Path('/logs/verifier/{mark}').write_text('x')\n"
              "def pytest_collection_modifyitems(items):\n    items.clear()\n")
    ini = f"[pytest]\naddopts = -p {mark}\npythonpath = .\n"
    dirs = [str(p) for p in trial.dir.parents] + ["/tmp", "/", "/app/.."]
    cmd = "; ".join(f"printf %s '{ini}' > {d}/pytest.ini; printf %s \"{plugin}\" > {d}/{mark}.py"
                    for d in dirs)
    trial.exec(cmd)                                  # unsolved: out.txt is never written
    v = verify(trial)
    assert v.reward.value == 0.0 and v.reward.passed == 0
    assert not (trial.dir / "verifier" / mark).exists()
    assert not [d for d in dirs[:-1] if (Path(d) / f"{mark}.py").exists()]
    trial.close()


def test_2_no_trial_sees_another_trials_processes_or_files(sandbox, tmp_path):
    task = _task(tmp_path)
    a, b = sandbox.create(task, 1), sandbox.create(task, 2)
    secret = _marker()
    b.exec(f"echo {secret} > note.txt")
    started = threading.Event()
    t = threading.Thread(target=lambda: (started.set(), b.exec(f"sleep 4; : {secret}", timeout_s=20)))
    t.start()
    started.wait()
    for _ in range(100):                              # B's command is running on the host
        if _host_procs_with(secret):
            break
        threading.Event().wait(0.05)
    assert _host_procs_with(secret)
    hide = lambda s: f"$(echo {base64.b64encode(s.encode()).decode()} | base64 -d)"   # noqa: E731
    r = a.exec(f"ps ax -o args; cat /proc/[0-9]*/cmdline; cat {hide(str(b.workspace))}/note.txt "
               f"{hide(str(b.dir))}/trial.json; ls {hide(str(b.dir))} {sandbox.run_dir}; "
               f"grep -rsI {hide(secret)} / --exclude-dir=proc --exclude-dir=sys", timeout_s=60)
    t.join()
    assert secret not in r.stdout + r.stderr and b.trial_id not in r.stdout
    a.close()
    b.close()


def test_3_the_project_and_its_git_history_are_not_there(sandbox, tmp_path):
    host = subprocess.run(["git", "-C", str(REPO), "show", "HEAD:examples/tasks/text-sort/solution/solve.sh"],
                          capture_output=True, text=True)
    assert host.returncode == 0 and "sort" in host.stdout    # the attack works on the host
    trial = sandbox.create(_task(tmp_path), 0)
    r = trial.exec(f"git -C {REPO} show HEAD:examples/tasks/text-sort/solution/solve.sh; "
                   f"cat {POOL}/text-sort/solution/solve.sh; ls {REPO} {REPO}/.git")
    assert "sort in.txt" not in r.stdout and r.exit_code != 0
    trial.close()


def test_4_the_verifier_does_not_follow_the_agents_links_out(sandbox, tmp_path):
    secret = _marker()
    private = tmp_path / "root-only.txt"
    private.write_text(secret + "\n")
    private.chmod(0o600)
    trial = sandbox.create(_task(tmp_path), 0)
    trial.exec(f"ln -s {private} out.txt; ln -s /proc/1/environ in2.txt")
    v = verify(trial)
    assert v.reward.passed == 0
    assert secret not in (v.output.stdout + v.output.stderr) and secret not in _everything_written(trial)
    trial.close()


def test_5_a_hostile_test_sh_is_no_one_on_the_host(sandbox, tmp_path, monkeypatch):
    secret, survivor = _marker(), _marker()
    monkeypatch.setenv("T1_CAMPAIGN_SECRET", secret)      # the campaign process's own secret
    sibling = sandbox.create(_task(tmp_path / "sib"), 0)
    sibling.exec("sort in.txt > out.txt")
    verify(sibling)
    sib_result = (sibling.dir / "verifier" / "result.json").read_text()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    victim = subprocess.Popen(["sleep", "120"])
    test_sh = f"""
cat /proc/[0-9]*/environ | tr '\\0' '\\n'; env
ls -R {POOL} {tmp_path / 'sib'}; cat {POOL}/*/solution/solve.sh
echo '{{"run_tag": "{run_tag_for(sibling)}", "reward": {{"value": 1.0}}}}' > {sibling.dir}/verifier/result.json
nsenter --net=/proc/1/ns/net bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'
echo hi > /dev/tcp/127.0.0.1/{port}
kill -9 {victim.pid} {os.getpid()}; kill -STOP {os.getpid()}
setsid bash -c 'exec -a {survivor} sleep 300' > /dev/null 2>&1 &
exit 0
"""
    trial = sandbox.create(_task(tmp_path / "hostile", test_sh), 0)
    v = verify(trial)
    try:
        assert secret not in (v.output.stdout + v.output.stderr) and secret not in _everything_written(trial)
        assert "sort in.txt" not in v.output.stdout
        assert (sibling.dir / "verifier" / "result.json").read_text() == sib_result
        recorded = json.loads(sib_result)
        assert recorded["run_tag"] == run_tag_for(sibling) and recorded["reward"]["value"] == pytest.approx(0.2)
        with pytest.raises(socket.timeout):
            server.accept()
        assert victim.poll() is None                     # still alive
        assert not _host_procs_with(survivor)
        assert v.reward.value == 0.0
    finally:
        victim.kill()
        server.close()
        trial.close()
        sibling.close()


def test_6_a_unix_socket_in_a_shared_dir_is_out_of_reach(sandbox, tmp_path):
    path = Path("/tmp") / f"{_marker()}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    path.chmod(0o777)                                 # anyone on the host could connect
    server.listen(1)
    server.settimeout(0.5)
    trial = sandbox.create(_task(tmp_path), 0)
    try:
        r = trial.exec(f"python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{path}'); "
                       f"s.send(b'hi'); print('connected')\"")
        assert "connected" not in r.stdout
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()
        path.unlink()
        trial.close()


def test_7_memory_is_limited_in_sum_not_per_process(tmp_path, env_backend):
    sb = Sandbox(tmp_path / "sbx", "run-mem", limits=Limits(storage_mb=512), backend=env_backend)
    src = _task(tmp_path).path     # the task's own [environment] memory_mb is the trial's limit
    (src / "task.toml").write_text((src / "task.toml").read_text().replace("memory_mb = 512", "memory_mb = 200"))
    trial = sb.create(load_task(src), 0)
    assert trial.limits.memory_mb == 200
    hog = ("python3 -c \"import time, pathlib, sys; x = bytearray(150 * 2**20); time.sleep(4); "
           "pathlib.Path('/app/held-' + sys.argv[1]).touch()\"")
    r = trial.exec(" & ".join(f"{hog} {i}" for i in range(4)) + " & wait", timeout_s=60)
    held = [p.name for p in trial.workspace.glob("held-*")]   # held 150 MiB to the end
    assert len(held) <= 1 and r.reason == "memory_limit", (held, r)
    # the trial's tmpfs pages count against the same limit
    r = trial.exec("for i in 1 2 3 4 5 6; do head -c 50M /dev/zero > /dev/shm/f$i || exit 1; done", timeout_s=60)
    assert r.reason == "memory_limit", r
    trial.close()


def test_8_secrets_never_reach_disk_in_any_form(tmp_path, env_backend):
    value = f"sk-{uuid.uuid4().hex}"
    src = _task(tmp_path).path
    toml = (src / "task.toml").read_text().replace("required_env_keys = []", 'required_env_keys = ["API_TOKEN"]')
    (src / "task.toml").write_text(toml)
    sb = Sandbox(tmp_path / "sbx", "run-secret", environ={"API_TOKEN": value}, backend=env_backend)
    trial = sb.create(load_task(src), 0)
    r = trial.exec('echo $API_TOKEN; echo $API_TOKEN | rev; printf %s "$API_TOKEN" | base64; '
                   'printf "x%s" "$API_TOKEN" | base64; printf %s "$API_TOKEN" | xxd -p | tr -d "\\n"; '
                   'echo $API_TOKEN >&2')
    forms = [value, value[::-1], value.encode().hex()]
    seen = r.stdout + r.stderr + _everything_written(trial)
    assert not [f for f in forms if f in seen] and "[REDACTED:API_TOKEN]" in seen
    trial.close()


@pytest.mark.parametrize("depth, verdict", [(1100, "ok"), (2500, "tamper")])
def test_9_a_deep_tree_ends_in_a_recorded_verdict(sandbox, tmp_path, depth, verdict):
    trial = sandbox.create(_task(tmp_path), 0)
    r = trial.exec(f"python3 -c \"import os\nfor _ in range({depth}): os.mkdir('dd'); os.chdir('dd')\"",
                   timeout_s=120)
    assert r.reason == "ok", r
    v = verify(trial)                                    # never a RecursionError
    assert v.reason == verdict and v.reward.value == 0.0
    if verdict == "tamper":
        assert "scan-failed" in v.reward.source
    recorded = json.loads((trial.dir / "verifier" / "result.json").read_text())
    assert recorded["run_tag"] == run_tag_for(trial) and recorded["reason"] == verdict
    trial.close()


def test_10_the_escape_test_can_fail(sandbox, tmp_path):
    """The write-outside test is only worth something if a real escape would show: the very
    check it uses does see a file written on the host /tmp."""
    mark = _marker()
    trial = sandbox.create(_task(tmp_path), 0)
    trial.exec(f"echo x > /tmp/{mark}")
    assert (trial.fs / "tmp" / mark).exists() and not (Path("/tmp") / mark).exists()
    (Path("/tmp") / mark).write_text("x")            # what an escape would leave
    try:
        assert (Path("/tmp") / mark).exists()
    finally:
        (Path("/tmp") / mark).unlink()
    trial.close()


def test_trial_json_records_uids_and_isolation(sandbox, tmp_path):
    trial = sandbox.create(_task(tmp_path), 0)
    meta = json.loads((trial.dir / "trial.json").read_text())
    assert meta["uid"] != 0 and meta["verifier_uid"] != 0 and meta["uid"] != meta["verifier_uid"]
    assert meta["isolation"] == "strict" and meta["network"] is False
    trial.close()
