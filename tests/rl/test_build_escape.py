"""Issue #51, class 1: a task's image build cannot act on the host (rl/agent/build_rules.py).

CVE-2024-1753 reproduced on this host's podman 4.3.1 / buildah 1.28 (docs/sandbox.md "Builds":
the build read a root-only host file into the image and created a root-owned file on the
host). Here the same Dockerfile, and every other instruction that reaches outside the image,
is refused naming its line by ``tasks check``/``import``/load, and by the build itself when
the load-time check is bypassed; the container test builds it through t1ops and finds the host
untouched."""
from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path

import pytest

from rl.agent.build_rules import build_refusals
from rl.agent.tasks import load_task
from rl.errors import TaskError
from t1ops.task_import import do_check, do_import
from tests.rl.test_sandbox_attack_classes import _one_line, _task

CVE = ("FROM python:3.11-slim AS base\nRUN ln -s / /rootdir && echo {pwned}\nFROM python:3.11-slim\n"
       "RUN --mount=type=bind,from=base,source=/rootdir,destination=/rootdir,rw "
       "cat /rootdir/{secret} > /stolen; touch /rootdir/{pwned}\nWORKDIR /app\n")


@pytest.mark.parametrize("line, why", [
    ("RUN --mount=type=bind,from=base,source=/rootdir,target=/r,rw true", "type=bind"),   # the issue's
    ("RUN --mount=from=base,source=/,target=/r true", "type=bind"),          # own: bind is the default type
    ("RUN --mount=type=cache,target=/root/.cache,from=base,source=/ true", "type=cache"),   # own
    ("RUN --mount=type=secret,id=x,src=/etc/shadow cat /run/secrets/x", "type=secret"),   # own
    ("RUN --network=host curl http://127.0.0.1:8265/", "--network=host"),  # the issue's: host network
    ("RUN --security=insecure mount -t proc none /mnt", "--security"),     # the issue's: privileged
    ("ONBUILD RUN --mount=type=bind,source=/,target=/h true", "type=bind"),  # own: a deferred one
    ("ADD http://127.0.0.1:8265/api/jobs/ /jobs.json", "ADD of a URL"),    # own: fetched on the host's net
    ("RUNX true", "unknown instruction"),
])
def test_every_instruction_that_reaches_outside_the_image_is_refused_by_line(line, why):
    refused = build_refusals(f"FROM python:3.11-slim AS base\nFROM python:3.11-slim\n{line}\n")
    assert len(refused) == 1 and refused[0].startswith("line 3:") and why in refused[0], refused


def test_what_stays_in_the_image_is_accepted():
    ok = ("# syntax=docker/dockerfile:1\nFROM python:3.11-slim AS b\nRUN --mount=type=tmpfs,target=/t true\n"
          "RUN --network=none pip --version\nFROM python:3.11-slim\nCOPY --from=b /etc/hostname /x\n"
          "ADD local.tar /opt/\nRUN echo --mount=type=bind --network=host\nWORKDIR /app\n")
    assert build_refusals(ok) == []
    assert "escape" in build_refusals("# escape=`\nFROM x\n")[0]


def test_tasks_check_import_and_load_refuse_the_cve_dockerfile(tmp_path):
    src = _task(tmp_path, files={"environment/Dockerfile": CVE.format(secret="s", pwned="p")})
    report = do_check(src, backend="container")
    assert not report.ok and "line 4: RUN --mount=type=bind" in _one_line(report.refused[0]["message"])
    with pytest.raises(TaskError, match="a build may not reach outside the image"):
        load_task(src)
    pool = tmp_path / "pool-import"
    assert not do_import([src], pool).ok and not (pool / src.name).exists()


def test_the_build_refuses_it_when_the_load_check_is_bypassed_and_the_host_is_untouched(tmp_path):
    """Built through t1ops on this host's podman: refused before the builder runs, whatever
    the task object says; no host file is read or created."""
    from rl.agent.container import images
    from tests.rl.container_support import require_container_runtime

    require_container_runtime()
    tag = uuid.uuid4().hex
    secret, pwned = Path(f"/root/t1ops-cve-secret-{tag}"), Path(f"/root/t1ops-cve-pwned-{tag}")
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    try:
        src = _task(tmp_path, files={"environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\n"})
        task = load_task(src)
        (src / "environment" / "Dockerfile").write_text(CVE.format(secret=secret.relative_to("/"),
                                                                   pwned=pwned.relative_to("/")))
        with pytest.raises(images.ImageBuildError, match="line 4: RUN --mount=type=bind") as refused:
            images.build(dataclasses.replace(task))
        _one_line(refused.value)
        assert not pwned.exists()
    finally:
        secret.unlink(missing_ok=True)
        pwned.unlink(missing_ok=True)
