"""Task images: each task's ``environment/Dockerfile`` + context built once per host, by content.

The cache key is the SHA-256 of the Dockerfile, every context file (relative path, mode, bytes;
links by target) and the build args; the image is tagged ``localhost/t1ops-task/<task>:<key16>``
and carries the key as a label, so a second build of the same content is a lookup
(``podman image exists``). Builds are bounded (:data:`MAX_CONCURRENT_BUILDS` per process, a
file lock per key across processes), time-limited by the task's ``[environment]
build_timeout_sec``, and logged under ``<cache>/builds/<key16>.log``. A failed build is an
:class:`ImageBuildError` whose ``line`` is the Dockerfile step that failed (verdict
``build-failed``), never a crash of the run.

``FROM`` names resolve locally first (``--pull=missing``): on a registry-less host the
stand-ins made by ``t1ops images seed`` (label ``t1ops.standin``) satisfy them; a digest-pinned
``FROM name@sha256:...`` whose digest is absent is rebuilt against ``name`` from a copy of the
Dockerfile, and both are reported (:func:`from_report`). docs/containers.md.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from rl.agent import dockerfile
from rl.agent.build_rules import build_refusals
from rl.agent.container import egress, runtime
from rl.agent.container.diagnose import build_reason, one_line
from rl.agent.tasks import Task
from rl.errors import SandboxError

MAX_CONCURRENT_BUILDS = int(os.environ.get("T1OPS_MAX_BUILDS", "2"))
DEFAULT_BUILD_TIMEOUT_S = 600.0
STANDIN_LABEL = "t1ops.standin"
_BUILDS = threading.BoundedSemaphore(MAX_CONCURRENT_BUILDS)
_STEP = re.compile(r"^STEP (\d+)/(\d+): (.*)$")


def cache_dir() -> Path:
    d = Path(os.environ.get("T1OPS_IMAGE_CACHE", "/var/cache/t1ops/images"))
    (d / "builds").mkdir(parents=True, exist_ok=True)
    return d


class ImageBuildError(SandboxError):
    """A task image that could not be built: ``line`` names the failing Dockerfile step."""

    def __init__(self, message: str, *, line: str = "", log: str = "", **ctx) -> None:
        super().__init__(message, line=line, log=log, **ctx)
        self.line, self.log = line, log


@dataclass(frozen=True)
class FromName:
    line: int
    name: str               # as written (may carry @sha256:...)
    resolved: str           # what the build uses
    present: bool           # an image of that name is on this host
    standin: bool           # ... made by `t1ops images seed`
    note: str = ""


@dataclass
class Image:
    tag: str
    key: str
    cached: bool
    build_s: float = 0.0
    log: Path | None = None
    froms: list[FromName] = field(default_factory=list)
    workdir: str | None = None
    user: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def task_settings(task: Task) -> dict:
    """``[environment]`` of task.toml as written (build_timeout_sec, mcp_servers, build args)."""
    try:
        data = tomllib.loads((task.path / "task.toml").read_text(errors="replace"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    env = data.get("environment")
    return env if isinstance(env, dict) else {}


def content_key(task: Task, build_args: dict[str, str] | None = None) -> str:
    """SHA-256 over the Dockerfile, the context files and the build args (module doc)."""
    h = hashlib.sha256(b"t1ops-image-v1\0")
    root = task.environment_dir
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            p = Path(dirpath, name)
            rel = p.relative_to(root).as_posix()
            st = p.lstat()
            h.update(f"{rel}\0{st.st_mode & 0o777 | (st.st_mode & 0o170000)}\0".encode())
            h.update(os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
            h.update(b"\0")
    for k, v in sorted((build_args or {}).items()):
        h.update(f"arg\0{k}={v}\0".encode())
    return h.hexdigest()


def image_tag(task: Task, key: str) -> str:
    name = re.sub(r"[^a-z0-9_.-]", "-", task.name.lower())[:100] or "task"
    return f"localhost/t1ops-task/{name}:{key[:16]}"


def exists(ref: str) -> bool:
    return runtime.podman("image", "exists", ref, check=False, timeout=60).returncode == 0


def _is_standin(ref: str) -> bool:
    res = runtime.podman("image", "inspect", "--format", "{{index .Labels \"%s\"}}" % STANDIN_LABEL,
                         ref, check=False, timeout=60)
    return res.returncode == 0 and res.stdout.strip() not in ("", "<no value>")


def from_report(text: str) -> list[FromName]:
    """Every ``FROM`` of a Dockerfile: present here? a stand-in? (``tasks check`` prints it)."""
    out, stages = [], set()
    for line in dockerfile.parse(text):
        if line.keyword != "FROM":
            continue
        words = [w for w in line.args.split() if not w.startswith("--")]
        if not words:
            continue
        name = words[0]
        if len(words) >= 3 and words[1].lower() == "as":
            stages.add(words[2].lower())
        if name.lower() in stages or name == "scratch":
            continue
        resolved, note = name, ""
        if "@" in name and not exists(name):
            resolved = name.split("@", 1)[0]
            note = f"digest {name.split('@', 1)[1][:19]}... not on this host: built against {resolved}"
        present = exists(resolved)
        standin = present and _is_standin(resolved)
        if standin:
            note = (note + "; " if note else "") + f"{resolved} is a stand-in (t1ops images seed)"
        out.append(FromName(line.number, name, resolved, present, standin, note))
    return out


def _rewrite_froms(text: str, froms: list[FromName]) -> str:
    lines = text.splitlines()
    for f in froms:
        if f.resolved != f.name:
            lines[f.line - 1] = lines[f.line - 1].replace(f.name, f.resolved, 1)
    return "\n".join(lines) + "\n"


def failing_step(log: str) -> str:
    """The Dockerfile step a failed build stopped at ("STEP 3/5: RUN pip install ...")."""
    m = re.search(r'building at STEP "([^"]*)"', log)
    steps = [s for s in log.splitlines() if _STEP.match(s.strip())]
    if m:
        return one_line(m.group(1))
    return one_line(steps[-1]) if steps else ""


def build(task: Task, *, build_args: dict[str, str] | None = None,
          timeout_s: float | None = None, network: str = "default") -> Image:
    """The task's image, built now or found in the cache (module doc)."""
    path = task.environment_dir / "Dockerfile"
    if not path.is_file():
        raise ImageBuildError(f"{task.name}: no environment/Dockerfile to build", task=task.name)
    settings = task_settings(task)
    timeout_s = timeout_s or float(settings.get("build_timeout_sec") or DEFAULT_BUILD_TIMEOUT_S)
    key = content_key(task, build_args)
    tag = image_tag(task, key)
    if exists(tag):
        return _described(Image(tag, key, cached=True))
    logs = cache_dir() / "builds"
    with _BUILDS, open(logs / f"{key[:16]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)             # one build per key across processes
        if exists(tag):
            return _described(Image(tag, key, cached=True))
        return _build_now(task, key, tag, build_args or {}, timeout_s, network,
                          logs / f"{key[:16]}.log")


def _build_now(task: Task, key: str, tag: str, build_args: dict[str, str], timeout_s: float,
               network: str, log_path: Path) -> Image:
    text = (task.environment_dir / "Dockerfile").read_text(errors="replace")
    refused = build_refusals(text)   # checked at load too; again here, on the bytes the builder reads
    if refused:
        raise ImageBuildError(f"{task.name}: the build may not reach outside the image: {'; '.join(refused)[:600]}",
                              line=refused[0], task=task.name)
    froms = from_report(text)
    missing = [f for f in froms if not f.present]
    t0 = time.monotonic()
    with tempfile.NamedTemporaryFile("w", suffix=".Dockerfile", delete=False) as tmp:
        tmp.write(_rewrite_froms(text, froms))
    argv = ["build", "--pull=missing" if missing else "--pull=never", "-f", tmp.name, "-t", tag,
            "--label", f"t1ops.key={key}", "--label", f"t1ops.task={task.name}", "--layers",
            f"--network={egress.build_network() if network == 'default' else network}"]
    for k, v in sorted(build_args.items()):
        argv += ["--build-arg", f"{k}={v}"]
    try:
        res = runtime.podman(*argv, str(task.environment_dir), timeout=timeout_s, check=False)
        log = res.stdout + res.stderr
        rc = res.returncode
    except SandboxError as e:
        log, rc = f"build stopped: {e}", None
    finally:
        os.unlink(tmp.name)
    log_path.write_text(log)
    if rc != 0:
        step = failing_step(log) or ("timeout" if rc is None else "")
        why = (f"build took over build_timeout_sec = {timeout_s:g}s" if rc is None
               else _why(log, missing))
        raise ImageBuildError(f"{task.name}: image build failed at {step or 'an unknown step'}: "
                              f"{why} (log: {log_path})", line=step, log=str(log_path), task=task.name)
    return _described(Image(tag, key, cached=False, build_s=time.monotonic() - t0, log=log_path,
                            froms=froms))


def _why(log: str, missing: list[FromName]) -> str:
    tail = [s for s in log.strip().splitlines()
            if s.strip() and not s.startswith("Error: building at STEP")][-3:]
    if missing and any("pull" in s or "registry" in s or "resolve" in s for s in tail):
        names = ", ".join(f.resolved for f in missing)
        return (f"base image {names} is not on this host and no registry was reachable; run "
                f"`t1ops images seed {' '.join(f.resolved for f in missing)}`")
    return build_reason(log) or one_line(" | ".join(tail), 400)


def _described(img: Image) -> Image:
    """WORKDIR, USER and ENV of the built image (``podman image inspect``)."""
    res = runtime.podman("image", "inspect", "--format",
                         "{{json .Config.WorkingDir}}\t{{json .Config.User}}\t{{json .Config.Env}}",
                         img.tag, timeout=60)
    import json
    wd, user, env = res.stdout.strip().split("\t")
    img.workdir, img.user = json.loads(wd) or None, json.loads(user) or None
    img.env = dict(e.split("=", 1) for e in (json.loads(env) or []) if "=" in e)
    return img


DEFAULT_BASE = os.environ.get("T1OPS_DEFAULT_BASE_IMAGE", "python:3.12-slim")


def default_dockerfile() -> str:
    """The image of a task without a Dockerfile (the bundled pool): a Python base with the
    host's pytest and pytest-json-ctrf versions; the workspace is environment/ (copied as the
    local backend does), so every such task shares this one image."""
    from importlib.metadata import version

    return (f"FROM {DEFAULT_BASE}\n"
            f"RUN pip install --no-cache-dir pytest=={version('pytest')} "
            f"pytest-json-ctrf=={version('pytest-json-ctrf')}\nWORKDIR /app\n")


def build_default(run_id: str = "", timeout_s: float = DEFAULT_BUILD_TIMEOUT_S) -> Image:
    text = default_dockerfile()
    key = hashlib.sha256(b"t1ops-default-v1\0" + text.encode()).hexdigest()
    tag = f"localhost/t1ops-default:{key[:16]}"
    if exists(tag):
        return _described(Image(tag, key, cached=True))
    logs = cache_dir() / "builds"
    with _BUILDS, open(logs / f"{key[:16]}.lock", "w") as lock, \
            tempfile.TemporaryDirectory(prefix="t1ops-default-") as ctx:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if exists(tag):
            return _described(Image(tag, key, cached=True))
        (Path(ctx) / "Dockerfile").write_text(text)
        t0 = time.monotonic()
        res = runtime.podman("build", "--pull=missing", "-t", tag, "--label", f"t1ops.key={key}",
                             f"--network={egress.build_network()}", ctx, timeout=timeout_s, check=False)
        (logs / f"{key[:16]}.log").write_text(res.stdout + res.stderr)
        if res.returncode != 0:
            step = failing_step(res.stdout + res.stderr)
            raise ImageBuildError(f"default image build failed at {step}: "
                                  f"{_why(res.stdout + res.stderr, [])}", line=step)
        return _described(Image(tag, key, cached=False, build_s=time.monotonic() - t0))
