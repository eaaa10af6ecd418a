"""The environment seam's local backend: which Dockerfile lines it honours, which it refuses."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.agent import dockerfile
from rl.agent.environment import LOCAL, require_runnable
from rl.agent.tasks import load_task
from rl.errors import TaskError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"


def test_honourable_dockerfile_builds_the_workspace(tmp_path):
    task = load_task(FIX / "pool" / "hello-app")
    check = LOCAL.check(task)
    assert check.runs_locally and check.workdir == "/app"
    assert task.image_env == {"GREETING_FILE": "/app/data/greeting.txt", "LANG": "C.UTF-8"}
    ws = tmp_path / "ws"
    LOCAL.populate(task, ws)
    assert (ws / "data" / "greeting.txt").read_text() == "hello, harbor\n"
    assert (ws / "out").is_dir() and not (ws / "Dockerfile").exists()


def test_each_unhonourable_line_is_named_with_its_reason(tmp_path):
    task = load_task(FIX / "pool" / "needs-container")
    check = LOCAL.check(task)
    assert not check.runs_locally
    assert [n.split(":")[0] for n in check.needs] == ["needs a container runtime (line 3",
                                                      "needs a container runtime (line 5",
                                                      "needs a container runtime (line 6"]
    assert "t1ops-no-such-package" in check.needs[0] and "another image" in check.needs[2]
    with pytest.raises(TaskError, match="needs-container"):
        require_runnable([task])
    with pytest.raises(TaskError, match="cannot build"):
        LOCAL.populate(task, tmp_path / "ws")


@pytest.mark.parametrize("line, ok", [
    ("RUN mkdir -p /app/a /app/b", True),
    ("RUN mkdir /etc/x", False),
    ("RUN apt-get update && apt-get install -y bash coreutils", True),
    ("RUN pip install pytest", True),
    ("RUN pip install pytest==0.0.1", False),
    ("RUN pip install -r requirements.txt", False),
    ("RUN make all", False),
    ("RUN set -eux; mkdir -p /app/logs", True),
    ("COPY data.txt /etc/data.txt", False),
    ("ADD https://example.com/x.tar.gz /app/", False),
    ("COPY missing.txt /app/", False),
    ("COPY data.txt ./sub/", True),
    ("USER 1000", True),
    ("VOLUME /data", False),
    ("FROM base AS build", False),
])
def test_single_lines(tmp_path, line, ok):
    (tmp_path / "data.txt").write_text("x")
    plan = dockerfile.plan(f"FROM python:3.11\nWORKDIR /app\n{line}\n", tmp_path)
    assert plan.runs_locally is ok, plan.refusals
    if not ok:
        assert plan.refusals[0].startswith("line 3:")


def test_multi_service_compose_needs_a_container_runtime(tmp_path):
    src = tmp_path / "t"
    shutil.copytree(FIX / "pool" / "count-words", src)
    (src / "environment" / "docker-compose.yaml").write_text(
        "services:\n  client: {image: x}\n  db: {image: postgres}\n")
    check = LOCAL.check(load_task(src))
    assert not check.runs_locally and "2 services" in check.needs[0]


def test_network_is_needed_only_when_declared_and_not_allowed(tmp_path):
    src = tmp_path / "net"
    shutil.copytree(FIX / "pool" / "count-words", src)
    text = (src / "task.toml").read_text().replace("[environment]", "[environment]\nallow_internet = true")
    (src / "task.toml").write_text(text)
    task = load_task(src)
    assert LOCAL.check(task).needs == ("needs network (allow_internet = true; this run allows none)",)
    assert LOCAL.check(task, allow_internet=True).runs_locally


_DF_WORDS = ["FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "mkdir", "-p", "/app",
             "..", "$X", "${Y:-z}", "\\", "&&", "|", "pip", "install", "apt-get", "=", "'", '"', "#",
             "\n", " ", "--from=a", "x.tar.gz", "http://h/x"]


@given(st.lists(st.sampled_from(_DF_WORDS), max_size=40))
@settings(max_examples=150, deadline=None)
def test_any_dockerfile_text_is_a_plan_never_a_crash(tmp_path_factory, words):
    ctx = tmp_path_factory.mktemp("ctx")
    plan = dockerfile.plan(" ".join(words), ctx)
    assert isinstance(plan.refusals, list)
    for src, dest in plan.copies:
        assert not dest.startswith("..") and not dest.startswith("/")


def test_env_path_extends_the_image_default_never_an_empty_one():
    workdir, env = dockerfile.image_settings('FROM x\nENV PATH="/opt/tool/bin:$PATH" A=${UNSET}b\n')
    assert env == {"PATH": "/opt/tool/bin:" + dockerfile.IMAGE_DEFAULT_PATH, "A": "b"}
