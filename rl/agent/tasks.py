"""Harbor task layout, read directly (Harbor itself needs Python >= 3.12).

A task directory holds::

    <name>/
      instruction.md        the only text the agent sees
      task.toml             timeouts, resources, env (read as Harbor does: rl/agent/task_toml.py)
      environment/          the build context: a Dockerfile (rl/agent/dockerfile.py) or plain
                            files copied into the workspace
      tests/test.sh         the verifier; writes CTRF and/or /logs/verifier/reward.txt
      solution/solve.sh     a reference solution (``t1ops tasks run --oracle``)

``tests/`` is checksummed (sha256 per file) when the task is loaded; the
verifier re-checks that digest before and after it runs, so an edit made
during the episode is detected (report section 10: verifier integrity).

Budgets: a task-declared timeout wins over a global override unless the
caller passes ``allow_lower=True``; the report's summarisation incident also
"had a global timeout override silently halving task-declared budgets".
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl.agent.bounded import read_regular, short
from rl.agent.build_rules import build_refusals
from rl.agent.dockerfile import image_settings
from rl.agent.task_toml import (parse_size_mb, parse_task_toml, read_task_toml,  # noqa: F401
                               resolve_env, template_vars, workdir_problem)
from rl.errors import TaskError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "timeout-override": ("rollout.timeout_override_s", "rollout.allow_lower_timeouts"),
}

log = logging.getLogger("rl.agent.tasks")

DEFAULT_AGENT_TIMEOUT_S = 600.0     # used only when task.toml declares none
DEFAULT_VERIFIER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Task:
    """One Harbor task, validated and checksummed at load time (fields: docs/tasks.md)."""

    name: str
    path: Path
    family: str
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    required_env_keys: tuple[str, ...] = ()
    memory_mb: int | None = None           # [environment] memory_mb, or memory = "4G"
    max_turns: int | None = None
    allow_internet: bool | None = None     # None: not declared (Harbor's default is true)
    verifier_env: dict[str, str] = field(default_factory=dict)
    tests_sha256: dict[str, str] = field(default_factory=dict)   # relpath -> sha256
    tests_digest: str = ""
    # the bytes hashed at load time: the verifier installs these, never re-reads the disk
    tests_snapshot: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)
    solution: str | None = None                                  # solve.sh text
    cpus: float | None = None
    storage_mb: int | None = None          # [environment] storage_mb, or storage = "10G"
    gpus: int = 0
    docker_image: str | None = None        # a prebuilt image: only a container runtime has it
    workdir: str | None = None             # [environment] workdir (else the Dockerfile's WORKDIR)
    env: dict[str, str] = field(default_factory=dict)            # [environment.env] templates
    solution_env: dict[str, str] = field(default_factory=dict)   # [solution.env]
    ignored: tuple[str, ...] = ()          # task.toml keys kept but not used, "key (why)"
    image_env: dict[str, str] = field(default_factory=dict)      # the Dockerfile's ENV lines
    reward_range: tuple[float, float] = (0.0, 1.0)               # [verifier] reward_range

    @property
    def agent_env(self) -> dict[str, str]:
        """What the task's commands see besides the sandbox's base, with no host variable
        allowed (see :meth:`resolved_env`)."""
        return self.resolved_env(os.environ, frozenset())[0]

    def resolved_env(self, environ, allow) -> tuple[dict[str, str], dict[str, str]]:
        """(the Dockerfile's ENV then ``[environment.env]`` with ``${VAR}`` resolved from
        ``environ`` for the names in ``allow`` only, {VAR: value} taken from ``environ``:
        redact them like secrets). rl/agent/task_toml.py:resolve_env."""
        env, taken = resolve_env(self.env, environ, allow)
        return {**self.image_env, **env}, taken

    @property
    def allow_network(self) -> bool:
        """Whether the task asks for network (``allow_internet = true``, declared)."""
        return self.allow_internet is True

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"


@dataclass(frozen=True)
class TaskCheck:
    """Everything wrong with one task directory (all problems, not the first), and what
    its task.toml holds that t1ops ignores. ``task`` is set only when nothing is wrong."""

    path: Path
    task: "Task | None"
    problems: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()             # dotted task.toml keys of the problems, if any


@dataclass(frozen=True)
class Budget:
    """An effective timeout and why it has that value (``source``: task|override|default)."""

    timeout_s: float
    source: str
    reason: str


def snapshot_tree(root: Path) -> dict[str, bytes]:
    """{relpath: bytes} of every regular file under ``root``.

    A symlink or special file inside the tree is a TaskError: the verifier must not
    follow links the task author (or an agent) planted.
    """
    files: dict[str, bytes] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            raise TaskError(f"{root}: {rel} is a link or special file; tests/ may hold only "
                            "regular files and directories", path=str(root), member=rel)
        if p.is_file():
            files[rel] = read_regular(p, MAX_TASK_FILE_BYTES)[0]
    return files


MAX_TASK_FILE_BYTES = 32 * 2**20
MAX_NAME_CHARS = 64
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _text(path: Path) -> str:
    """A task file's text: a regular file (never a FIFO, never through a final link), bounded."""
    return read_regular(path, MAX_TASK_FILE_BYTES)[0].decode("utf-8", errors="replace")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a task name (it names trial dirs and cgroups), or None."""
    if len(name) > MAX_NAME_CHARS or not _NAME.match(name):
        return (f"task name {short(name, 80)!r} must be at most {MAX_NAME_CHARS} characters of "
                "letters, digits, '.', '_' or '-', starting with a letter or digit")
    return None


def links_leaving(root: Path, max_entries: int = 100_000) -> list[str]:
    """Entries under ``root`` that a reader would follow out of it: a link whose target
    leaves ``root`` (judged lexically against ``root``, link by link) or a special file
    (FIFO, socket, device). Never follows a link itself."""
    bad: list[str] = []
    base = os.path.realpath(root)
    stack, seen = [str(root)], 0
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError as e:
            return bad + [f"{short(top, 120)} ({e.strerror})"]
        for entry in entries:
            seen += 1
            if seen > max_entries:
                return bad + [f"more than {max_entries} entries"]
            rel = os.path.relpath(entry.path, root)
            if entry.is_symlink():
                target = os.readlink(entry.path)
                joined = os.path.normpath(os.path.join(os.path.dirname(entry.path), target))
                real = os.path.realpath(entry.path)
                inside = lambda p: p == base or p.startswith(base + "/")  # noqa: E731
                if target.startswith("/") or not inside(joined) or not inside(real):
                    bad.append(f"{short(rel, 120)} -> {short(target, 120)} leaves the task")
            elif entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif not entry.is_file(follow_symlinks=False):
                bad.append(f"{short(rel, 120)} is a special file (FIFO, socket or device)")
    return bad


def digest_files(files: dict[str, bytes]) -> tuple[str, dict[str, str]]:
    """(digest over all files, {relpath: sha256}) for a :func:`snapshot_tree` result."""
    shas = {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())}
    outer = hashlib.sha256("\n".join(f"{k} {v}" for k, v in shas.items()).encode()).hexdigest()
    return outer, shas


def hash_tree(root: Path) -> tuple[str, dict[str, str]]:
    """sha256 of every regular file under ``root``: (digest over all, {relpath: sha256})."""
    return digest_files(snapshot_tree(root))


LEGACY_HINT = ("older Terminal-Bench layout (task.yaml, run-tests.sh, solution.sh); convert it "
               "to the Harbor layout with `t1ops tasks import DIR --into POOL`")


def inspect_task(path: str | Path) -> TaskCheck:
    """Read one task directory and collect every problem (see :class:`TaskCheck`)."""
    root = Path(path).resolve()
    if not root.is_dir():  # not a link escape: nothing is there (issue 55)
        what = "does not exist" if not root.exists() else "is a file, not a task directory"
        return TaskCheck(root, None, (f"{root} {what}; a task is a directory with instruction.md, task.toml "
                                      "and tests/test.sh (docs/tasks.md)",))
    if (root / "task.yaml").is_file() and not (root / "task.toml").is_file():
        return TaskCheck(root, None, (f"{root}: {LEGACY_HINT}",))
    problems: list[str] = [f"{root}: {p}" for p in filter(None, [name_problem(root.name)])]
    leaving = links_leaving(root)
    if leaving:
        problems.append(f"{short(root, 120)}: {len(leaving)} entr(y/ies) a reader would follow out of "
                        f"the task: {'; '.join(leaving[:3])}; keep every link inside the task")
    if problems:
        return TaskCheck(root, None, tuple(problems))
    missing = [f for f in ("instruction.md", "task.toml", "tests/test.sh") if not (root / f).is_file()]
    if missing:
        problems.append(f"{root}: not a Harbor task, missing {missing}; see docs/tasks.md")
    report, keys = None, []
    if (root / "task.toml").is_file():
        source = str(root / "task.toml")
        try:
            report = read_task_toml(_text(root / "task.toml"), source=source)
        except (TaskError, OSError) as e:
            problems.append(str(e))
        else:
            problems += [f"{source}: {msg}" for _, msg in report.problems]
            keys = [k for k, _ in report.problems]
    snapshot = None
    if (root / "tests").is_dir():
        try:
            snapshot = snapshot_tree(root / "tests")
        except (TaskError, OSError) as e:
            problems.append(str(e))
    ignored = report.ignored if report else ()
    if not problems and report is not None and (root / "environment" / "Dockerfile").is_file():
        try:
            text = _text(root / "environment" / "Dockerfile")
            wd, _ = image_settings(text)
        except OSError as e:
            problems.append(f"{root}: environment/Dockerfile: {short(e, 200)}")
        else:
            if wd and workdir_problem(wd):
                problems.append(f"{root}/environment/Dockerfile: WORKDIR {workdir_problem(wd)}")
            problems += [f"{root}/environment/Dockerfile: {r}; a build may not reach outside the image "
                         "(docs/sandbox.md \"Builds\")" for r in build_refusals(text)]
    if problems or report is None or snapshot is None:
        return TaskCheck(root, None, tuple(problems), ignored, tuple(keys))
    return TaskCheck(root, _build(root, report.data, snapshot, ignored), (), ignored)


def _build(root: Path, data: dict[str, Any], snapshot: dict[str, bytes],
           ignored: tuple[str, ...]) -> Task:
    meta, agent = data.get("metadata", {}), data.get("agent", {})
    verifier, env = data.get("verifier", {}), data.get("environment", {})
    solution = data.get("solution", {})
    digest, files = digest_files(snapshot)
    sol = root / "solution" / "solve.sh"
    memory = env.get("memory_mb", parse_size_mb(env["memory"]) if "memory" in env else None)
    storage = env.get("storage_mb", parse_size_mb(env["storage"]) if "storage" in env else None)
    internet = env.get("allow_internet", env.get("allow_network"))
    workdir, image_env = None, {}
    if (root / "environment" / "Dockerfile").is_file():
        workdir, image_env = image_settings(_text(root / "environment" / "Dockerfile"))
    task_env = dict(env.get("env", {}))
    secret_keys = tuple(dict.fromkeys(env.get("required_env_keys", ())))
    return Task(
        name=root.name, path=root,
        family=meta.get("family") or meta.get("category") or root.name.split("-")[0],
        instruction=_text(root / "instruction.md"),
        agent_timeout_s=float(agent.get("timeout_sec", DEFAULT_AGENT_TIMEOUT_S)),
        verifier_timeout_s=float(verifier.get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S)),
        required_env_keys=secret_keys,
        memory_mb=memory, max_turns=agent.get("max_turns"), allow_internet=internet,
        verifier_env=dict(verifier.get("env", {})),
        tests_sha256=files, tests_digest=digest, tests_snapshot=snapshot,
        solution=_text(sol) if sol.is_file() else None,
        cpus=env.get("cpus"), storage_mb=storage, gpus=env.get("gpus", 0),
        docker_image=env.get("docker_image"), workdir=env.get("workdir") or workdir,
        env=task_env, solution_env=dict(solution.get("env", {})), ignored=ignored,
        image_env=image_env, reward_range=tuple(verifier.get("reward_range", (0.0, 1.0))),
    )


def load_task(path: str | Path) -> Task:
    """Read one Harbor task directory; any problem is a TaskError naming all of them."""
    check = inspect_task(path)
    if check.task is None:
        raise TaskError("; ".join(check.problems), path=str(check.path),
                        key=check.keys[0] if check.keys else None, problems=list(check.problems))
    return check.task


def load_pool(root: str | Path) -> list[Task]:
    """Every task directory directly under ``root``, sorted by name; any bad task is a
    TaskError naming every problem of every bad task."""
    base = Path(root)
    if not base.is_dir():
        raise TaskError(f"task pool {base} is not a directory", path=str(base))
    checks = [inspect_task(p) for p in sorted(base.iterdir())
              if p.is_dir() and not p.name.startswith(".")]
    if not checks:
        raise TaskError(f"task pool {base} holds no task directories", path=str(base))
    problems = [msg for c in checks for msg in c.problems]
    if problems:
        raise TaskError(f"task pool {base}: {len(problems)} problem(s): " + "; ".join(problems),
                        path=str(base), problems=problems)
    return [c.task for c in checks if c.task is not None]


def effective_timeout(task_timeout_s: float, override_s: float | None, *,
                      allow_lower: bool = False, what: str = "agent") -> Budget:
    """The budget a trial gets: the task's own unless an override raises it (or lowers it
    with ``allow_lower=True``). Every override that is ignored or applied is logged."""
    if override_s is None:
        return Budget(task_timeout_s, "task", f"{what} timeout from task.toml")
    if override_s <= 0:
        raise TaskError(f"global {what} timeout override {override_s} must be > 0", key="override_s")
    if override_s >= task_timeout_s:
        reason = f"override {override_s:g}s raises task-declared {task_timeout_s:g}s"
        log.info("%s budget: %s", what, reason)
        return Budget(override_s, "override", reason)
    if allow_lower:
        reason = (f"override {override_s:g}s LOWERS task-declared {task_timeout_s:g}s "
                  "(explicitly allowed)")
        log.warning("%s budget: %s", what, reason)
        return Budget(override_s, "override-lowered", reason)
    reason = (f"override {override_s:g}s ignored: it would lower the task-declared "
              f"{task_timeout_s:g}s; set rollout.allow_lower_timeouts = true to force it")
    log.warning("%s budget: %s", what, reason)
    return Budget(task_timeout_s, "task", reason)
