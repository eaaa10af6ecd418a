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
from rl.agent.verifier import verify
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


PROBE = """import socket, struct, sys
def gateway():   # this container's own default gateway (a host address on a bridge)
    for line in open('/proc/net/route').read().splitlines()[1:]:
        f = line.split()
        if f[1] == '00000000':
            return socket.inet_ntoa(struct.pack('<L', int(f[2], 16)))
for a in sys.argv[1:]:
    host, port = a.rsplit(':', 1)
    host = gateway() if host == 'GW' else host
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print('REACHED', host, a)
    except OSError as e:
        print('BLOCKED', host, a, type(e).__name__)
"""


def _host_addresses() -> list[str]:
    import subprocess

    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    return [f.split()[3].split("/")[0] for f in out.splitlines() if " lo " not in f]


def _internet_reachable() -> bool:
    import socket

    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("where", ["build", "allow_internet-trial"])
def test_builds_and_networked_trials_reach_no_address_of_the_host(tmp_path, where):
    """The issue's: builds and allow_internet trials used podman's default bridge, whose gateway
    and node addresses reach every host service on 0.0.0.0. Own: the trial network's gateway
    and every address of every host interface, for a build step and for a trial alike."""
    import socket

    from rl.agent.container import images
    from rl.agent.container.egress import SUPERNET
    from tests.rl.container_support import require_container_runtime
    from tests.rl.test_sandbox_attack_classes import BACKENDS

    require_container_runtime()
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(8)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    gateways = [str(next(SUPERNET.subnets(new_prefix=24))[1]), "10.88.0.1"]
    targets = [f"{a}:{port}" for a in [*_host_addresses(), *gateways, "GW"]]
    targets += ["pypi.org:443"] if _internet_reachable() else []
    try:
        if where == "build":
            src = _task(tmp_path, files={"environment/probe.py": PROBE, "environment/Dockerfile":
                                         images.default_dockerfile() + "COPY probe.py /probe.py\n"
                                         f"RUN python3 /probe.py {' '.join(targets)} # {uuid.uuid4().hex}\n"})
            out = images.build(load_task(src)).log.read_text()
        else:
            src = _task(tmp_path, toml_extra="")
            (src / "task.toml").write_text((src / "task.toml").read_text().replace(
                "memory_mb = 512", "memory_mb = 512\nallow_internet = true"))
            trial = BACKENDS["container"](tmp_path / "sbx", "run-egress", allow_internet=True).create(load_task(src), 0)
            (trial.workspace / "probe.py").write_text(PROBE)
            out = trial.exec(f"python3 probe.py {' '.join(targets)}").stdout
            trial.close()
        print(out)
        assert not [ln for ln in out.splitlines() if ln.startswith("REACHED") and f":{port}" in ln], out
        if targets[-1].startswith("pypi"):   # the internet itself stays reachable
            assert "REACHED pypi.org pypi.org:443" in out, out
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


# --- class 4: no resource outside the declared limits ------------------------------------------

def _volumes() -> set[str]:
    import subprocess

    return set(subprocess.run(["podman", "volume", "ls", "-q"], capture_output=True, text=True).stdout.split())


def test_an_image_volume_is_bounded_by_the_trial_and_leaves_nothing(tmp_path):
    """The issue's: an image VOLUME became an anonymous podman volume per trial on the host disk,
    outside storage_mb (192 MiB from a 32 MiB trial), never removed. Own: the populate and the
    verifier containers made one each as well; a leftover one is found and removed by
    `doctor --reap`."""
    from rl.agent.container import images, runtime
    from tests.rl.container_support import require_container_runtime
    from tests.rl.test_sandbox_attack_classes import BACKENDS

    require_container_runtime()
    before = _volumes()
    src = _task(tmp_path, 'ls /data > /logs/verifier/seen.txt\n', files={"environment/Dockerfile": (
        images.default_dockerfile() + "COPY in.txt /app/in.txt\nRUN mkdir -p /data && echo seeded > /data/f\n"
        "RUN chmod 1777 /data\nVOLUME /data\n")})
    (src / "task.toml").write_text((src / "task.toml").read_text().replace(
        "memory_mb = 512", "memory_mb = 128\nstorage_mb = 32"))
    trial = BACKENDS["container"](tmp_path / "sbx", "run-volume").create(load_task(src), 0)
    r = trial.exec("cat /data/f; dd if=/dev/zero of=/data/big bs=1M count=192 2>/dev/null; echo rc=$?; "
                   "stat -c size=%s /data/big")
    size = int(r.stdout.rsplit("size=", 1)[1]) if "size=" in r.stdout else 0
    assert r.stdout.startswith("seeded") and size < 128 * 2**20 and "rc=0" not in r.stdout, r   # held by memory_mb
    verify(trial)
    tag = trial.image.tag
    trial.close()
    assert _volumes() == before   # nothing on the host's disk outside the trial
    # a leftover (a container removed without -v, as t1ops did before) is reaped
    name = f"t1ops-vol-{uuid.uuid4().hex[:8]}"
    runtime.podman("create", "--name", name, tag, "true")
    runtime.podman("rm", name)
    left = _volumes() - before
    assert left and {x.name for x in runtime.leftovers() if x.kind == "volume"} >= left
    gone = runtime.reap(only_dead=True)   # what `t1ops doctor --reap` calls
    assert {x.name for x in gone} >= left and _volumes() - before == set()
