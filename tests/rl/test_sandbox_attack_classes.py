"""Issue #28's red team, one test per class (docs/sandbox.md "Classes closed"): each attack runs
for real as a hostile agent (commands in the trial) or a hostile task author (``tests/test.sh``,
``task.toml``, an archive), and the test asserts that its effect did not happen, or that the bad
input was refused with one bounded line and nothing left behind. Every marker is fresh (uuid).

The trial-level attacks are parametrized over the environment backend (``backend`` fixture):
"local" and "container" (podman; skipped, saying why, where no runtime can be had)."""
from __future__ import annotations

import io
import os
import shutil
import socket
import tarfile
import threading
import uuid
from pathlib import Path

import pytest

from rl.agent.sandbox import Sandbox
from rl.agent.sandbox.jail import View, run_jailed
from rl.agent.sandbox.limits import Limits
from rl.agent.tasks import load_task
from rl.agent.verifier import verify
from rl.errors import SandboxError, TaskError
from t1ops.task_import import do_check, do_import

REPO = Path(__file__).resolve().parents[2]
POOL = REPO / "examples" / "tasks"
BACKENDS = {                       # name -> Sandbox-like factory(root, run_id, **kw)
    "local": Sandbox,
    "container": lambda root, run_id, **kw: Sandbox(root, run_id, backend="container", **kw),
}
PYTEST_FROM_APP = ('cd "$T1_WORKSPACE"\npython3 -m pytest -q -p no:cacheprovider --ctrf "$T1_CTRF_PATH" '
                   '"$T1_TESTS_DIR"\n')


@pytest.fixture(params=sorted(BACKENDS))
def backend(request, tmp_path):
    """A factory of sandboxes of one backend under this test's tmp dir."""
    assert os.geteuid() == 0
    if request.param == "container":
        from tests.rl.container_support import require_container_runtime

        require_container_runtime()
    return lambda run_id="run-classes", **kw: BACKENDS[request.param](tmp_path / "sbx", run_id, **kw)


def _marker() -> str:
    return f"t1mark{uuid.uuid4().hex}"


def _task(tmp_path: Path, test_sh: str | None = None, toml_extra: str = "", name: str = "text-sort",
          files: dict[str, str] | None = None) -> Path:
    src = tmp_path / "pool" / name
    shutil.copytree(POOL / "text-sort", src)
    if test_sh is not None:
        (src / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    if toml_extra:
        (src / "task.toml").write_text((src / "task.toml").read_text() + toml_extra)
    for rel, text in (files or {}).items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    return src


def _one_line(err: BaseException | str, limit: int = 1200) -> str:
    text = str(err)
    assert "\n" not in text and len(text) <= limit, text[:2000]
    return text


# --- class 1: agent files run as the verifier -------------------------------------------------

@pytest.mark.parametrize("plant", ["stdlib-module", "git-config"])
def test_class1_nothing_the_agent_leaves_runs_as_the_verifier(backend, tmp_path, plant):
    mark = _marker()
    evil = f"open('/logs/verifier/{mark}', 'w').write('ran')\n"
    if plant == "stdlib-module":   # `python -m pytest` from /app: cwd first on sys.path
        test_sh, cmd = PYTEST_FROM_APP, f"sort in.txt > out.txt; printf \"{evil}\" > tempfile.py; " \
                                        f"cp tempfile.py json.py; cp tempfile.py shlex.py"
    else:                          # git reads the repository's own config: fsmonitor runs a program
        test_sh = 'cd "$T1_WORKSPACE"\ngit status >/dev/null 2>&1\n' + PYTEST_FROM_APP
        # written by hand, as git itself would write it: the attack needs no git in the agent's
        # image, only in the verifier's (where the image has none, the verdict must hold anyway)
        cmd = ("sort in.txt > out.txt; mkdir -p .git/objects .git/refs && echo 'ref: refs/heads/main' > .git/HEAD"
               f" && printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch /logs/verifier/{mark}; false\\n'"
               " > .git/config")
    trial = backend().create(load_task(_task(tmp_path, test_sh)), 0)
    assert trial.exec(cmd).reason == "ok"
    v = verify(trial)
    assert not (trial.dir / "verifier" / mark).exists()
    assert v.reason in ("ok", "tamper") and (v.reason == "ok") == (v.reward.passed == 4)
    trial.close()


# --- class 2: the verdict is bounded and checked ----------------------------------------------

FORGED_CTRF = ('python3 - <<EOF\nimport json, time\nt = int(time.time() * 1000)\n'
               'tests = [{"name": f"test_outputs.py::test_x{i}", "status": "passed"} for i in range(1000)]\n'
               'json.dump({"results": {"summary": {"tests": 1000, "passed": 1000, "failed": 0, "start": t, '
               '"stop": t}, "tests": tests}}, open("/logs/verifier/ctrf.json", "w"))\nEOF\n')


@pytest.mark.parametrize("test_sh", [
    FORGED_CTRF,                                                      # 1000 passes of tests nobody wrote
    'echo 1000000 > /logs/verifier/reward.txt\n',                     # a reward file past any range
    PYTEST_FROM_APP + 'echo 1 > /logs/verifier/reward.txt\n',         # 0/4 passed, the file says solved
])
def test_class2_a_verdict_never_exceeds_what_the_tests_give(backend, tmp_path, test_sh):
    trial = backend().create(load_task(_task(tmp_path, test_sh)), 0)   # the agent does nothing
    v = verify(trial)
    assert v.reward.value == 0.0 and v.reason == "tamper", v
    trial.close()


# --- class 3: root never follows a path the agent controls ------------------------------------

def test_class3_root_follows_no_link_the_trial_planted(backend, tmp_path):
    host_dir = tmp_path / f"host-{_marker()}"
    host_dir.mkdir()
    src = _task(tmp_path)
    (src / "task.toml").write_text((src / "task.toml").read_text().replace(
        "memory_mb = 512", 'memory_mb = 512\nworkdir = "/run"'))
    with pytest.raises(TaskError, match="environment.workdir") as refused:   # a system WORKDIR
        load_task(src)
    _one_line(refused.value)
    # the construction itself: a bind or file target under an agent-writable dir is never followed
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink(host_dir / "pwned", ws / "f")
    (tmp_path / "jroot").mkdir()
    view = View(tmp_path / "jroot", rw=(("/w", ws),), files=(("/w/f", "root wrote this"),), cwd="/")
    try:
        run_jailed(["/bin/true"], view, env={"PATH": "/usr/bin:/bin"}, uid=1_000_123, limits=Limits(),
                   cgroup=None, timeout_s=30, log_dir=tmp_path / "logs", network=False)
    except SandboxError as e:
        _one_line(e)
    assert not (host_dir / "pwned").exists() and os.listdir(host_dir) == []


# --- class 4: a task author reads nothing of the host ------------------------------------------

def test_class4_templates_read_only_allowed_variables(backend, tmp_path, monkeypatch):
    value = f"host-{_marker()}"
    monkeypatch.setenv("T1_HOST_ONLY", value)
    src = _task(tmp_path, toml_extra='\n[environment.env]\nLEAK = "${T1_HOST_ONLY:-none}"\n')
    trial = backend(environ=dict(os.environ)).create(load_task(src), 0)
    r = trial.exec("echo $LEAK")
    assert value not in r.stdout and r.stdout.strip() == "none"
    trial.close()


def test_class4_verifier_outputs_are_redacted(backend, tmp_path):
    value = f"sk-{uuid.uuid4().hex}"
    src = _task(tmp_path, 'cp /app/tok /logs/verifier/copied.txt\n')
    (src / "task.toml").write_text((src / "task.toml").read_text().replace(
        "required_env_keys = []", 'required_env_keys = ["API_TOKEN"]'))
    trial = backend(environ={"API_TOKEN": value}).create(load_task(src), 0)
    trial.exec("echo $API_TOKEN > tok")
    verify(trial)
    written = [p.read_bytes() for p in (trial.dir / "verifier").rglob("*") if p.is_file()]
    assert written and not [w for w in written if value.encode() in w]
    trial.close()


def _tar(members: list[tuple[str, str | None, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, link, text in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                data = text.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_class4_imports_refuse_every_link_out_of_the_task(tmp_path):
    base = [(f"t/{rel}", None, (POOL / "text-sort" / rel).read_text())
            for rel in ("instruction.md", "task.toml", "tests/test.sh", "tests/test_outputs.py",
                        "environment/in.txt")]
    arc = tmp_path / "t.tar.gz"        # one '..' past the task root, still inside the archive root
    arc.write_bytes(_tar(base + [("t/environment/x", "../../t.sibling", "")]))
    src = _task(tmp_path, name="linked")          # a task directory with a link out of it
    os.symlink("/etc/hostname", src / "environment" / "host.txt")
    for item in (arc, src):
        pool = tmp_path / f"into-{item.name}"
        report = do_import([item], pool)
        assert not report.ok and len(report.refused) == 1, report
        _one_line(report.refused[0]["message"])
        assert not pool.exists() or not [p for p in pool.iterdir()], list(pool.iterdir())


# --- class 5: a network-enabled trial does not share the host's network namespace -----------

def test_class5_a_networked_trial_never_reaches_host_loopback(backend, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    abstract = socket.socket(socket.AF_UNIX)
    name = _marker()
    abstract.bind("\0" + name)
    abstract.listen(1)
    abstract.settimeout(0.5)
    src = _task(tmp_path)
    (src / "task.toml").write_text((src / "task.toml").read_text().replace(
        "memory_mb = 512", "memory_mb = 512\nallow_internet = true"))
    try:
        trial = backend(allow_internet=True).create(load_task(src), 0)
    except SandboxError as e:          # no egress-only namespace here: refused, named
        assert "network namespace" in _one_line(e)
    else:
        port = server.getsockname()[1]
        trial.exec(f"echo hi > /dev/tcp/127.0.0.1/{port}; python3 -c \"import socket; "
                   f"s = socket.socket(socket.AF_UNIX); s.connect('\\0{name}')\"")
        trial.close()
    try:
        for s in (server, abstract):
            with pytest.raises(socket.timeout):
                s.accept()
    finally:
        server.close()
        abstract.close()


# --- class 6: declared limits hold for the verifier and are bounded ---------------------------

def test_class6_the_tasks_memory_limit_holds_for_its_verifier(backend, tmp_path):
    src = _task(tmp_path, "python3 -c \"x = bytearray(700 * 2**20); open('/logs/verifier/held', 'w')\"\n")
    (src / "task.toml").write_text((src / "task.toml").read_text().replace("memory_mb = 512", "memory_mb = 256"))
    trial = backend(limits=Limits(storage_mb=64)).create(load_task(src), 0)
    v = verify(trial)
    assert not (trial.dir / "verifier" / "held").exists() and v.reward.value == 0.0
    trial.close()


@pytest.mark.parametrize("field, line", [
    ("environment.memory_mb", "memory_mb = 9223372036854775807"),
    ("environment.cpus", "memory_mb = 512\ncpus = 1e12"),
    ("environment.storage_mb", "memory_mb = 512\nstorage_mb = 1099511627776"),
])
def test_class6_limits_above_the_host_are_refused_naming_the_field(tmp_path, field, line):
    src = _task(tmp_path)
    (src / "task.toml").write_text((src / "task.toml").read_text().replace("memory_mb = 512", line))
    report = do_check(src)
    assert not report.ok and field in _one_line(report.refused[0]["message"])
    pool = tmp_path / "pool-import"
    assert not do_import([src], pool).ok and not (pool / src.name).exists()


# --- class 7: no denial of service of t1ops itself ---------------------------------------------

def test_class7_a_fifo_in_place_of_a_file_never_blocks_verification(backend, tmp_path):
    src = _task(tmp_path, files={"environment/pytest.ini": "[pytest]\n"})
    trial = backend().create(load_task(src), 0)
    trial.exec("sort in.txt > out.txt; rm pytest.ini; mkfifo pytest.ini")
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("v", verify(trial)), daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():                   # release the blocked open before failing
        fd = os.open(trial.workspace / "pytest.ini", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    assert "v" in box, "verification blocked on a FIFO"
    trial.close()


@pytest.mark.parametrize("bad", ["deep-toml", "huge-int", "long-name", "absurd-cpus"])
def test_class7_hostile_task_files_are_one_line_refusals(tmp_path, bad):
    name = "n" * 250 if bad == "long-name" else "text-sort"
    src = _task(tmp_path, name=name)
    toml = (src / "task.toml").read_text()
    if bad == "deep-toml":
        toml += "\n[x]\ny = " + "[" * 50_000 + "]" * 50_000 + "\n"
    elif bad == "huge-int":
        toml = toml.replace("memory_mb = 512", "memory_mb = " + "9" * 5000)
    elif bad == "absurd-cpus":
        toml = toml.replace("memory_mb = 512", "memory_mb = 512\ncpus = 1e300")
    (src / "task.toml").write_text(toml)
    report = do_check(src)
    assert not report.ok and report.refused
    _one_line(report.refused[0]["message"])


def test_class7_a_tar_long_name_header_is_refused_unread(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("t/" + "a" * (4 * 2**20))
        tar.addfile(info, io.BytesIO(b""))
    arc = tmp_path / "long.tar.gz"
    arc.write_bytes(buf.getvalue())
    report = do_import([arc], tmp_path / "pool")
    assert not report.ok and "header" in _one_line(report.refused[0]["message"], 600)
    assert not (tmp_path / "pool").exists() or not list((tmp_path / "pool").iterdir())


# --- class 8: operator edges -------------------------------------------------------------------

def test_class8_endpoint_dump_names_bodies_and_idle_sessions(tmp_path):
    from starlette.testclient import TestClient

    from rl.harness.server import MAX_BODY_BYTES, SessionRegistry, build_app
    from rl.harness.standalone import dump_name

    made: list[str] = []

    class _Session:
        def __init__(self, name):
            self.session_id, self.closed = name, False
            made.append(name)

        def close(self):
            self.closed = True

    registry = SessionRegistry(factory=_Session, idle_s=0.0)
    client = TestClient(build_app(registry))
    r = client.post("/v1/chat/completions", content=b"{" + b" " * (MAX_BODY_BYTES + 1) + b"}")
    assert r.status_code == 413
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                  "user": "../../escape"})
    assert r.status_code == 400 and "../../escape" not in made
    for sid in ("../../escape", "/abs", "a/b", "..", "x" * 500):
        stem = dump_name(sid)
        assert "/" not in stem and not stem.startswith(".") and len(stem) <= 64
    registry.resolve("alice", None, None)
    threading.Event().wait(0.01)
    assert registry.expire() == ["alice"] and not registry.sessions()


def test_class8_t1ops_run_checks_the_pool_before_it_creates_anything(tmp_path):
    from t1ops.campaign.launch import run_campaign
    from t1ops.config import load_toml, parse_config

    cfg = load_toml(REPO / "examples" / "tiny" / "campaign.toml").model_dump()
    cfg["rollout"]["tasks_dir"] = str(tmp_path / "no-such-pool")
    out = tmp_path / "runs"
    with pytest.raises(TaskError, match="no-such-pool"):
        run_campaign(parse_config(cfg, source="test"), out_dir=str(out), show_progress=False)
    assert not out.exists() or not list(out.iterdir())
