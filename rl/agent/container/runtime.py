"""The OCI runtime client: the ``podman`` CLI (rootful, runc), labels, ownership and reaping.

Why the CLI and not the ``docker`` SDK against podman's Docker-API socket: the socket needs a
long-lived ``podman system service`` (one more daemon to start, supervise and secure), while the
CLI is the same code path podman's own tests and Harbor's podman environment use, needs no
extra Python dependency and reports build steps ("STEP n/m: RUN ...") that name a failing
line. ``T1OPS_CONTAINER_CLI=docker`` points the same calls at Docker's CLI (docs/containers.md).

Every container and network t1ops creates carries labels: ``t1ops.run`` (the run id),
``t1ops.owner`` (``<boot id>:<pid>:<process start ticks>`` of the creating process).
:func:`reap` removes those whose owner is gone (a SIGKILLed campaign), at backend start-up and
by ``t1ops doctor --reap``.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rl.errors import SandboxError

LABEL_RUN, LABEL_OWNER, LABEL_TRIAL = "t1ops.run", "t1ops.owner", "t1ops.trial"
SETUP_HINT = "run scripts/setup-container-runtime.sh (apt-get install podman runc mmdebstrap; docs/containers.md)"


def cli() -> str:
    return os.environ.get("T1OPS_CONTAINER_CLI", "podman")


def available() -> tuple[bool, str]:
    """(usable, why not): the CLI exists and can run as this user against its storage."""
    exe = shutil.which(cli())
    if exe is None:
        return False, f"{cli()} not installed; {SETUP_HINT}"
    try:
        version()
    except SandboxError as e:
        return False, str(e)
    return True, ""


@functools.lru_cache(maxsize=1)
def version() -> str:
    out = podman("version", "--format", "{{.Client.Version}}", timeout=30)
    return out.stdout.strip()


def podman(*args: str, timeout: float = 120, check: bool = True, env: dict | None = None,
           input: str | None = None) -> subprocess.CompletedProcess:
    """Run one CLI call; SandboxError naming the call and its stderr when it fails."""
    argv = [cli(), *args]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                             input=input, errors="replace")
    except FileNotFoundError as e:
        raise SandboxError(f"{cli()} not found; {SETUP_HINT}") from e
    except subprocess.TimeoutExpired as e:
        raise SandboxError(f"`{' '.join(argv[:3])} ...` took over {timeout:g}s", timeout=timeout) from e
    if check and res.returncode != 0:
        raise SandboxError(f"`{' '.join(argv[:3])} ...` failed (exit {res.returncode}): "
                           f"{res.stderr.strip()[-800:]}", exit_code=res.returncode)
    return res


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_label(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{_boot_id()}:{pid}:{_start_ticks(pid)}"


def owner_alive(owner: str) -> bool:
    """Whether the process named by an ``t1ops.owner`` label still runs (same boot, pid, start)."""
    try:
        boot, pid, ticks = owner.split(":")
    except ValueError:
        return False
    return boot == _boot_id() and _start_ticks(int(pid)) == ticks


def labels(run_id: str, trial_id: str = "") -> list[str]:
    out = ["--label", f"{LABEL_RUN}={run_id}", "--label", f"{LABEL_OWNER}={owner_label()}"]
    return out + (["--label", f"{LABEL_TRIAL}={trial_id}"] if trial_id else [])


@dataclass(frozen=True)
class Leftover:
    kind: str        # container | network | volume
    name: str
    run_id: str
    owner_alive: bool


def leftovers() -> list[Leftover]:
    """Every container, network and volume labelled by t1ops, with whether its owner lives."""
    out: list[Leftover] = []
    res = podman("ps", "-a", "--filter", f"label={LABEL_RUN}", "--format", "json", timeout=60)
    for c in json.loads(res.stdout or "[]") or []:
        lab = c.get("Labels") or {}
        name = (c.get("Names") or [c.get("Id", "?")])[0]
        out.append(Leftover("container", name, lab.get(LABEL_RUN, ""), owner_alive(lab.get(LABEL_OWNER, ""))))
    for kind in ("network", "volume"):
        res = podman(kind, "ls", "--filter", f"label={LABEL_RUN}", "--format", "json", timeout=60)
        for n in json.loads(res.stdout or "[]") or []:
            lab = n.get("labels") or n.get("Labels") or {}
            name = n.get("name") or n.get("Name") or "?"
            out.append(Leftover(kind, name, lab.get(LABEL_RUN, ""), owner_alive(lab.get(LABEL_OWNER, ""))))
    return out + _anonymous_volumes()


def _anonymous_volumes() -> list[Leftover]:
    """Anonymous volumes no container uses: what an image ``VOLUME`` leaves when its container is
    removed without ``-v`` (podman gives them no labels; t1ops' containers never make one now)."""
    res = podman("volume", "ls", "--filter", "dangling=true", "--format", "{{.Name}}", timeout=60, check=False)
    names = res.stdout.split() if res.returncode == 0 else []
    if not names:
        return []
    docs = json.loads(podman("volume", "inspect", *names, timeout=60, check=False).stdout or "[]") or []
    return [Leftover("volume", d.get("Name", "?"), "", False) for d in docs if d.get("Anonymous")]


def reap(*, only_dead: bool = True) -> list[Leftover]:
    """Remove the labelled containers, networks and volumes whose owner is gone (all with
    ``only_dead=False``); returns what was removed."""
    gone = [x for x in leftovers() if not (only_dead and x.owner_alive)]
    for x in sorted(gone, key=lambda x: x.kind != "container"):   # containers before networks
        args = {"container": ("rm", "-f", "-t", "0"), "network": ("network", "rm", "-f"),
                "volume": ("volume", "rm", "-f")}[x.kind]
        podman(*args, x.name, timeout=60, check=False)
    return gone


def remove_container(name: str) -> None:
    podman("rm", "-f", "-v", "-t", "0", name, timeout=60, check=False)   # -v: its anonymous volumes too
