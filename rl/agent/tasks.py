"""Harbor task layout, read directly (Harbor itself needs Python >= 3.12).

A task directory holds::

    <name>/
      instruction.md        the only text the agent sees
      task.toml             timeouts, family, resources, required env keys
      environment/          files copied into the agent's workspace (optional)
      tests/test.sh         the verifier; runs ``pytest --ctrf $T1_CTRF_PATH``
      solution/solve.sh     a reference solution (optional at run time)

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
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl.errors import TaskError

log = logging.getLogger("rl.agent.tasks")

# Harbor's key names (``timeout_sec``) are kept so real Harbor tasks load unchanged.
_SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "metadata": {"family": (str,), "difficulty": (str,), "category": (str,), "tags": (list,),
                 "author_name": (str,), "author_email": (str,)},
    "agent": {"timeout_sec": (int, float), "max_turns": (int,)},
    "verifier": {"timeout_sec": (int, float), "env": (dict,)},
    "environment": {"memory_mb": (int,), "cpus": (int, float), "storage_mb": (int,),
                    "build_timeout_sec": (int, float), "required_env_keys": (list,),
                    "allow_network": (bool,)},
}
_TOP_LEVEL = {"version": (str,)}
DEFAULT_AGENT_TIMEOUT_S = 600.0     # used only when task.toml declares none
DEFAULT_VERIFIER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Task:
    """One Harbor task, validated and checksummed at load time."""

    name: str
    path: Path
    family: str
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    required_env_keys: tuple[str, ...] = ()
    memory_mb: int | None = None
    max_turns: int | None = None
    allow_network: bool = False
    verifier_env: dict[str, str] = field(default_factory=dict)
    tests_sha256: dict[str, str] = field(default_factory=dict)   # relpath -> sha256
    tests_digest: str = ""
    # the bytes hashed at load time: the verifier installs these, never re-reads the disk
    tests_snapshot: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)
    solution: str | None = None                                  # solve.sh text

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"


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
            files[rel] = p.read_bytes()
    return files


def digest_files(files: dict[str, bytes]) -> tuple[str, dict[str, str]]:
    """(digest over all files, {relpath: sha256}) for a :func:`snapshot_tree` result."""
    shas = {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())}
    outer = hashlib.sha256("\n".join(f"{k} {v}" for k, v in shas.items()).encode()).hexdigest()
    return outer, shas


def hash_tree(root: Path) -> tuple[str, dict[str, str]]:
    """sha256 of every regular file under ``root``: (digest over all, {relpath: sha256})."""
    return digest_files(snapshot_tree(root))


def parse_task_toml(text: str, *, source: str = "task.toml") -> dict[str, Any]:
    """Parse and type-check task.toml text; unknown sections/keys and wrong types are TaskError."""
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TaskError(f"{source}: not valid TOML ({e}); fix the syntax", file=source) from e
    for key, value in data.items():
        if key in _TOP_LEVEL:
            _check_type(source, key, value, _TOP_LEVEL[key])
            continue
        if key not in _SCHEMA:
            raise TaskError(f"{source}: unknown key {key!r}; known: "
                            f"{sorted([*_SCHEMA, *_TOP_LEVEL])}", file=source, key=key)
        if not isinstance(value, dict):
            raise TaskError(f"{source}: [{key}] must be a table, got {type(value).__name__}",
                            file=source, key=key)
        for sub, sv in value.items():
            if sub not in _SCHEMA[key]:
                raise TaskError(f"{source}: unknown key {key}.{sub}; known: {sorted(_SCHEMA[key])}",
                                file=source, key=f"{key}.{sub}")
            _check_type(source, f"{key}.{sub}", sv, _SCHEMA[key][sub])
    _check_values(source, data)
    return data


def _check_type(source: str, key: str, value: Any, types: tuple[type, ...]) -> None:
    if isinstance(value, bool) and bool not in types:
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        names = "/".join(t.__name__ for t in types)
        raise TaskError(f"{source}: {key} must be {names}, got {type(value).__name__} {value!r:.40}",
                        file=source, key=key)


def _check_values(source: str, data: dict[str, Any]) -> None:
    for sec in ("agent", "verifier", "environment"):
        for sub in ("timeout_sec", "build_timeout_sec"):
            v = data.get(sec, {}).get(sub)
            if v is not None and not (0 < v <= 86_400):
                raise TaskError(f"{source}: {sec}.{sub} = {v} must be in (0, 86400] seconds",
                                file=source, key=f"{sec}.{sub}")
    env = data.get("environment", {})
    for sub in ("memory_mb", "storage_mb", "cpus"):
        if sub in env and env[sub] <= 0:
            raise TaskError(f"{source}: environment.{sub} = {env[sub]} must be > 0",
                            file=source, key=f"environment.{sub}")
    keys = env.get("required_env_keys", [])
    if not all(isinstance(k, str) and k.isidentifier() for k in keys):
        raise TaskError(f"{source}: environment.required_env_keys must be identifiers, got {keys!r:.80}",
                        file=source, key="environment.required_env_keys")
    venv = data.get("verifier", {}).get("env", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in venv.items()):
        raise TaskError(f"{source}: verifier.env must map strings to strings",
                        file=source, key="verifier.env")
    tags = data.get("metadata", {}).get("tags", [])
    if not all(isinstance(t, str) for t in tags):
        raise TaskError(f"{source}: metadata.tags must be strings", file=source, key="metadata.tags")


def load_task(path: str | Path) -> Task:
    """Read one Harbor task directory; missing files or a malformed task.toml are TaskError."""
    root = Path(path)
    missing = [f for f in ("instruction.md", "task.toml", "tests/test.sh") if not (root / f).is_file()]
    if missing:
        raise TaskError(f"{root}: not a Harbor task, missing {missing}; see rl/agent/tasks.py",
                        path=str(root), missing=missing)
    toml_path = root / "task.toml"
    data = parse_task_toml(toml_path.read_text(errors="replace"), source=str(toml_path))
    meta, agent = data.get("metadata", {}), data.get("agent", {})
    verifier, env = data.get("verifier", {}), data.get("environment", {})
    snapshot = snapshot_tree(root / "tests")
    digest, files = digest_files(snapshot)
    sol = root / "solution" / "solve.sh"
    return Task(
        name=root.name, path=root.resolve(),
        family=meta.get("family") or meta.get("category") or root.name.split("-")[0],
        instruction=(root / "instruction.md").read_text(),
        agent_timeout_s=float(agent.get("timeout_sec", DEFAULT_AGENT_TIMEOUT_S)),
        verifier_timeout_s=float(verifier.get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S)),
        required_env_keys=tuple(env.get("required_env_keys", ())),
        memory_mb=env.get("memory_mb"), max_turns=agent.get("max_turns"),
        allow_network=bool(env.get("allow_network", False)),
        verifier_env=dict(verifier.get("env", {})),
        tests_sha256=files, tests_digest=digest, tests_snapshot=snapshot,
        solution=sol.read_text() if sol.is_file() else None,
    )


def load_pool(root: str | Path) -> list[Task]:
    """Every task directory directly under ``root``, sorted by name (a bad one raises)."""
    base = Path(root)
    if not base.is_dir():
        raise TaskError(f"task pool {base} is not a directory", path=str(base))
    tasks = [load_task(p) for p in sorted(base.iterdir()) if p.is_dir() and not p.name.startswith(".")]
    if not tasks:
        raise TaskError(f"task pool {base} holds no task directories", path=str(base))
    return tasks


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
              f"{task_timeout_s:g}s; pass allow_lower to force it")
    log.warning("%s budget: %s", what, reason)
    return Budget(task_timeout_s, "task", reason)
