"""Issue #28's rules as units (no sandbox): what the verifier may load, bounded reads, archive
headers, link judgement. Fast companions of tests/rl/test_sandbox_attack_classes.py."""
from __future__ import annotations

import io
import os
import tarfile
import zipfile

import pytest

from rl.agent.archive import MAX_HEADER_BYTES, extract_task_bytes
from rl.agent.bounded import BoundedReadError, check_nesting, read_regular, short
from rl.agent.tamper import git_config_problem, scan_tree
from rl.agent.verifier_env import (import_dirs, module_name, protected_modules, task_env_for_verifier,
                                   verifier_search_path)
from rl.errors import UnsafeArchiveError


@pytest.mark.parametrize("entry, module", [
    ("json.py", "json"), ("json.pyc", "json"), ("json.cpython-311-x86_64-linux-gnu.so", "json"),
    ("json.abi3.so", "json"), ("json", "json"), ("pytest", "pytest"), ("x.dist-info", None),
    (".git", None), ("notes.txt", None),
])
def test_every_import_form_names_its_module(entry, module):
    assert module_name(entry) == module


def test_protected_names_cover_the_stdlib_and_the_venv():
    names = protected_modules()
    assert {"json", "tempfile", "os", "pytest", "_pytest", "pluggy", "ctrf"} <= names


@pytest.mark.parametrize("plant", ["json.pyc", "tempfile.cpython-311-x86_64-linux-gnu.so", "shlex",
                                   "link:pluggy.py", "dir:iniconfig"])
def test_a_protected_module_in_any_form_on_the_import_path_is_a_shadow(tmp_path, plant):
    ws, env = tmp_path / "ws", tmp_path / "env"
    (ws / "lib").mkdir(parents=True)
    env.mkdir()
    kind, _, name = plant.rpartition(":")
    target = ws / "lib" / name
    if kind == "link":
        os.symlink("/dev/null", target)
    elif kind == "dir" or "." not in name:
        target.mkdir()
    else:
        target.write_bytes(b"x")
    events = scan_tree("t", ws, env, import_dirs=["lib"])
    assert [e.kind for e in events] == ["shadow-module"], events
    assert scan_tree("t", ws, env) == [] or kind in ("link", "dir")   # off the path: only pytest's own


def test_import_dirs_follow_the_verifier_env_and_the_tests_intent():
    tests = {"test_x.py": b"from pathlib import Path\ndef test_a():\n    Path('out.txt')\n"}
    safe = {"PYTHONSAFEPATH": "1"}
    assert import_dirs(safe, "/app", tests) == []
    assert import_dirs({**safe, "PYTHONPATH": "/app/lib:/opt/x:src"}, "/app", tests) == ["lib", "src"]
    assert import_dirs({}, "/app", tests) == ["."]                      # safe-path turned off
    assert import_dirs(safe, "/app", {"t.py": b"import sys\nsys.path.insert(0, '/app')\n"}) == ["."]


def test_image_env_that_loads_code_never_reaches_the_verifier():
    env = {"PYTHONPATH": "/app", "LD_PRELOAD": "/app/x.so", "BASH_ENV": "/app/.rc", "GIT_DIR": "/app/g",
           "NODE_OPTIONS": "-r /app/x", "PERL5OPT": "-M", "GREETING_FILE": "/app/data/greeting.txt"}
    assert task_env_for_verifier({**env, "LANG": "C.UTF-8"}, "/app") == {"LANG": "C.UTF-8"}


@pytest.mark.parametrize("name, value", [
    ("GREETING_FILE", "/app/data/greeting.txt"),        # data, but the agent wrote it: only if declared
    ("VIRTUAL_ENV", "/app/.venv"),                      # the issue's: the image's venv under /app
    ("PIP_CONFIG_FILE", "/tmp/pip.conf"),               # own: a tool config in the agent's /tmp
    ("UV_CONFIG_FILE", "/logs/agent/../agent/uv.toml"),  # own: normalised, still the agent's
    ("OPTS", "--config=/app/x.cfg --fast"),             # own: a path inside an option
    ("XDG_CONFIG_HOME", "/usr/share:/dev/shm/cfg"),     # own: every tool's config dir, second in a list
])
def test_image_env_naming_an_agent_writable_path_never_reaches_the_verifier(name, value):
    assert task_env_for_verifier({name: value, "KEEP": "/usr/share/x"}, "/app") == {"KEEP": "/usr/share/x"}


def test_the_verifier_search_path_holds_no_directory_the_agent_writes():
    path = "/app/.venv/bin:/usr/local/bin:/tmp/bin::.:bin:/usr/bin:/logs/agent/x:/bin"
    assert verifier_search_path(path, "/app") == "/usr/local/bin:/usr/bin:/bin"
    assert verifier_search_path("/srv/ws/bin:/usr/bin", "/srv/ws") == "/usr/bin"


@pytest.mark.parametrize("config, bad", [
    ("[core]\n\trepositoryformatversion = 0\n\tbare = false\n[user]\n\temail = a@b\n", None),
    ('[remote "origin"]\n\turl = https://x\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n', None),
    ("[core]\n\tfsmonitor = touch /x\n", "core.fsmonitor"),
    ('[filter "x"]\n\tclean = sh -c evil\n', "filter.x.clean"),
    ('[diff "x"]\n\ttextconv = evil\n', "diff.x.textconv"),
    ("[diff]\n\texternal = evil\n", "diff.external"),
    ("[include]\n\tpath = /logs/agent/c\n", "include.path"),
    ('[includeIf "gitdir:/"]\n\tpath = x\n', "includeif"),
    ("[alias]\n\tst = !evil\n", "alias.st"),
    ("[core]\n\thooksPath = /app/h\n", "core.hookspath"),
    ("[core]\n\tpager = evil \\\n", "unreadable"),
])
def test_a_git_config_may_hold_only_inert_keys(config, bad):
    problem = git_config_problem(config)
    assert (problem is None) if bad is None else (bad in problem), problem


def test_bounded_reads_never_block_or_follow(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BoundedReadError, match="not a regular file"):
        read_regular(fifo, 100)                      # returns at once: O_NONBLOCK
    os.symlink("/etc/hostname", tmp_path / "link")
    with pytest.raises(BoundedReadError, match="following a link"):
        read_regular(tmp_path / "link", 100)
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(BoundedReadError, match="101 bytes"):
        read_regular(tmp_path / "big", 100)
    assert check_nesting("[" * 65) and check_nesting("[[1]]") is None
    assert "\n" not in short("a\nb" * 1000) and len(short("x" * 10_000)) < 400


def _tar_with(info: tarfile.TarInfo, data: bytes = b"", fmt=tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tar:
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_pax_headers_and_long_names_are_bounded(tmp_path):
    info = tarfile.TarInfo("t/x")
    info.pax_headers = {"comment": "c" * (MAX_HEADER_BYTES + 10)}
    with pytest.raises(UnsafeArchiveError, match="pax header") as e:
        extract_task_bytes(_tar_with(info), tmp_path / "a")
    assert len(str(e.value)) < 400
    with pytest.raises(UnsafeArchiveError, match="name over") as e:
        extract_task_bytes(_tar_with(tarfile.TarInfo("t/" + "b" * 2000)), tmp_path / "b")
    assert len(str(e.value)) < 400 and not list((tmp_path / "b").iterdir())


def test_a_zip_link_is_judged_against_the_task_root(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("t/instruction.md", "x")
        link = zipfile.ZipInfo("t/environment/out")
        link.external_attr = (0o120777 << 16)
        zf.writestr(link, "../../t.sibling")       # inside the archive, outside the task
    with pytest.raises(UnsafeArchiveError, match="outside the task root"):
        extract_task_bytes(buf.getvalue(), tmp_path / "pool")
    assert not [p for p in (tmp_path / "pool").iterdir()]

