"""The container backend (docs/containers.md): real podman + runc, the vendored Harbor tasks.

Unit tests first (no runtime needed), then a handful on the runtime, sharing small cached
images (the stand-ins of `t1ops images seed`; tests/rl/container_support.py skips, printing
why, where the runtime cannot be installed)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from rl.agent.container import images, runtime
from rl.agent.tasks import load_task
from tests.rl.container_support import require_container_runtime

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "harbor" / "container"


def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / "pool" / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


# --- no runtime needed ----------------------------------------------------------------------

def test_content_key_covers_dockerfile_context_and_args(tmp_path):
    d = _copy(tmp_path, "c-checksum")
    key = images.content_key(load_task(d))
    assert images.content_key(load_task(d)) == key
    assert images.content_key(load_task(d), {"V": "1"}) != key
    (d / "environment" / "data.bin").write_bytes(b"changed")
    assert images.content_key(load_task(d)) != key
    key2 = images.content_key(load_task(d))
    os.chmod(d / "environment" / "data.bin", 0o600)
    assert images.content_key(load_task(d)) != key2


def test_failing_step_names_the_dockerfile_line():
    log = ("STEP 1/3: FROM python:3.12-slim\nSTEP 2/3: RUN pip install nope==0\nERROR: no such\n"
           'Error: building at STEP "RUN pip install nope==0": while running runtime: exit status 1\n')
    assert images.failing_step(log) == "RUN pip install nope==0"
    assert images.failing_step("STEP 1/2: FROM x\nSTEP 2/2: COPY a b\nError: no such file") == "STEP 2/2: COPY a b"


def test_public_task_failures_are_named_from_their_output():
    # lines seen running public Harbor tasks (docs/containers.md, "Public tasks")
    from rl.agent.container import diagnose

    apt = "E: List directory /var/lib/apt/lists/partial is missing. - Acquire (30: Read-only file system)"
    assert "installs packages at verification time (E: List directory" in diagnose.verifier_reasons("", apt)[0]
    ro = "OSError: [Errno 30] Read-only file system: './ctrf.json'"
    assert diagnose.verifier_reasons(ro, "") == [f"test.sh writes outside /logs/verifier and the workdir ({ro})"]
    bad = "pytest: error: unrecognized arguments: --json-ctrf /logs/verifier/ctrf.json"
    assert diagnose.verifier_reasons("", bad) == [f"test.sh's pytest refused its command line ({bad})"]
    uv = "curl: (6) Could not resolve host: astral.sh"
    assert diagnose.verifier_reasons("x\n" + uv, "") == [f"needs a host it cannot reach ({uv})"]
    assert diagnose.verifier_reasons("4 passed", "") == []
    eperm = "E   PermissionError: [Errno 1] Operation not permitted: PosixPath('/tmp/probe')"
    assert diagnose.verifier_reasons(eperm, "")[0].startswith(f"test.sh needs root ({eperm})")
    failed = "FAILED ../tests/test_outputs.py::test_binary_exists - FileNotFoundError: [Errno 2] ..."
    assert diagnose.verifier_reasons(f"x\n{failed}\n", "") == [f"first failed test: {failed}"]
    log = ("STEP 2/4: RUN apt-get update \\\n    && curl -fsSL https://deb.nodesource.com/k | gpg\n"
           "curl: (6) Could not resolve host: deb.nodesource.com\ngpg: no valid OpenPGP data found.\n"
           'Error: building at STEP "RUN apt-get update     && curl -fsSL https://deb.nodesource.com/k '
           '| gpg": while running runtime: exit status 2\n')
    assert images.failing_step(log) == "RUN apt-get update && curl -fsSL https://deb.nodesource.com/k | gpg"
    assert images._why(log, []) == "needs a host it cannot reach (curl: (6) Could not resolve host: deb.nodesource.com)"


def test_owner_labels_tell_live_from_dead():
    assert runtime.owner_alive(runtime.owner_label())
    assert not runtime.owner_alive(runtime.owner_label().rsplit(":", 1)[0] + ":1")   # start ticks differ
    assert not runtime.owner_alive("other-boot:1:1")


# --- on the runtime -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    require_container_runtime()
    from rl.agent.sandbox import Sandbox

    return Sandbox(tmp_path_factory.mktemp("ctr"), f"run-ctr-{uuid.uuid4().hex[:6]}",
                   backend="container")


def test_oracle_of_a_vendored_harbor_task_gets_full_reward_and_the_image_is_cached(sandbox, tmp_path):
    from t1ops.task_runs import run_one

    task = load_task(_copy(tmp_path, "hello-world"))
    row = run_one(task, sandbox, 0, oracle=True)
    assert (row["reward"], row["source"], row["solved"]) == (1.0, "harbor-reward", True), row
    assert images.build(task).cached                     # built once per task per host
    base = run_one(task, sandbox, 1, oracle=False)       # an untouched workspace scores 0
    assert (base["reward"], base["solved"]) == (0.0, False), base


def test_a_failed_build_is_the_named_verdict_build_failed(sandbox, tmp_path):
    from t1ops.task_runs import _run_dir

    d = _copy(tmp_path, "hello-world")
    marker = uuid.uuid4().hex[:8]
    (d / "environment" / "Dockerfile").write_text(
        f"FROM python:3.11-slim\nWORKDIR /workspace\nRUN echo {marker} && exit 3\n")
    row = _run_dir(d, sandbox, 0, oracle=True, allow_internet=False,
                   env_backend=__import__("t1ops.task_runs", fromlist=["x"]).backend_named("container"))
    assert (row["reward"], row["source"]) == (0.0, "build-failed"), row
    assert f"RUN echo {marker} && exit 3" in row["reason"]
    assert not row["solved"]


def test_agent_runs_as_its_uid_without_network_in_a_read_only_root(sandbox, tmp_path):
    task = load_task(_copy(tmp_path, "c-checksum"))
    trial = sandbox.create(task, 0)
    try:
        assert trial.exec("id -u").stdout.strip() == str(trial.uid)
        assert trial.exec("ls /app").stdout.split() == ["checksum.c", "data.bin"]   # the image's WORKDIR
        assert trial.exec("gcc -O2 -o /app/checksum /app/checksum.c && /app/checksum /app/data.bin").reason == "ok"
        assert trial.exec("touch /usr/bin/x").reason == "exit_nonzero"              # read-only root
        assert trial.exec("ls /sys/class/net").stdout.split() == ["lo"]             # --network none
        assert trial.exec("test -e /tests || test -e /logs/verifier").reason == "exit_nonzero"
        hog = trial.exec("python3 -c 'b = bytearray(900 * 2**20); print(len(b))'", timeout_s=60)
        assert hog.reason == "memory_limit", hog                                     # 512 MB task
    finally:
        trial.close()
    names = runtime.podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert trial.container not in names and os.path.ismount(trial.fs) is False


def test_mcp_servers_answer_tools_list_before_the_agent_starts(sandbox, tmp_path):
    from rl.agent.container.mcp import McpNotReady

    d = _copy(tmp_path, "mcp-notes")
    trial = sandbox.create(load_task(d), 0, oracle=True)
    try:
        assert trial.mcp_tools == {"notes": ["secret_word"]}
    finally:
        trial.close()
    toml = (d / "task.toml").read_text().replace('args = ["/opt/mcp/notes_server.py"]',
                                                 'args = ["-c", "import sys; sys.exit(4)"]')
    (d / "task.toml").write_text(toml)
    with pytest.raises(McpNotReady, match="'notes' exited 4 before answering"):
        sandbox.create(load_task(d), 1)


def test_leftovers_of_a_dead_run_are_reaped(sandbox, monkeypatch, capsys):
    from t1ops.doctor import container_runtime

    name = f"t1ops-test-dead-{uuid.uuid4().hex[:6]}"
    dead = runtime.owner_label().rsplit(":", 1)[0] + ":1"        # this pid, another start: gone
    runtime.podman("run", "-d", "--name", name, "--label", f"{runtime.LABEL_RUN}=run-dead",
                   "--label", f"{runtime.LABEL_OWNER}={dead}", "--network", "none",
                   "--entrypoint", "sleep", "python:3.11-slim", "infinity")
    left = {x.name: x for x in runtime.leftovers()}
    assert name in left and not left[name].owner_alive
    from t1ops.commands import doctor

    monkeypatch.setattr("t1ops.doctor.run_checks", lambda: [container_runtime()])
    assert doctor.run(argparse.Namespace(json=True, reap=True)) == 0
    out = capsys.readouterr()
    assert f"container {name} (run run-dead)" in out.err, out
    assert json.loads(out.out)[0]["facts"]["dead"] == 0
    assert name not in runtime.podman("ps", "-a", "--format", "{{.Names}}").stdout.split()


def test_a_new_container_sandbox_removes_dead_runs_leftovers_and_records_them(sandbox, tmp_path, monkeypatch):
    # what a SIGKILLed campaign leaves is removed by the next one's start (docs/containers.md)
    from rl.agent.container import backend
    from rl.agent.sandbox import Sandbox

    name = f"t1ops-test-dead-{uuid.uuid4().hex[:6]}"
    dead = runtime.owner_label().rsplit(":", 1)[0] + ":1"
    runtime.podman("run", "-d", "--name", name, "--label", f"{runtime.LABEL_RUN}=run-killed",
                   "--label", f"{runtime.LABEL_OWNER}={dead}", "--network", "none",
                   "--entrypoint", "sleep", "python:3.11-slim", "infinity")
    monkeypatch.setattr(backend, "_REAPED", __import__("threading").Event())   # a fresh process
    box = Sandbox(tmp_path, "run-next", backend="container")
    record = json.loads((box.run_dir / "reaped-leftovers.json").read_text())
    assert {"kind": "container", "name": name, "run_id": "run-killed"} in record
    assert name not in runtime.podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
