"""Reading ``task.toml`` the way Harbor does: known fields typed, everything else kept.

Harbor's ``TaskConfig`` ignores keys it does not model and treats ``[metadata]``
as free-form, so real task files carry ``schema_version``, ``[task]``,
``[metadata] reward_type``, ``[environment] gpus / mcp_servers / healthcheck``
and more. Here every key is sorted into one of three bins (docs/tasks.md):

- **applied**: timeouts, ``[environment] cpus / memory_mb (or memory = "4G") /
  storage_mb (or storage) / allow_internet (or Harbor's newer network_mode) / env / workdir``,
  ``[verifier.env]``,
  ``[solution.env]``, our ``family``, ``max_turns``, ``required_env_keys``;
- **ignored**: anything else (unknown keys, unused metadata, Harbor features with
  no local meaning such as ``build_timeout_sec``); kept and listed once by
  ``t1ops tasks check``, never a refusal;
- **problems**: a known key with a wrong type or value, or a feature that would
  change the result if it were ignored (``[[steps]]``, ``os = "windows"``).
  Every problem is collected, not only the first.
"""
from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rl.agent.bounded import check_nesting, short
from rl.errors import TaskError

MAX_TIMEOUT_S = 86_400.0
# what each known key must be; "size" = int MiB or a "4G"/"512M" string (Harbor's deprecated form)
_NUM, _INT, _STR, _BOOL, _STRS = "number", "int", "string", "bool", "list of strings"
_ENV = "table of NAME = \"value\" (NAME: letters, digits, _; not starting with a digit)"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_RANGE = "[low, high] pair of numbers"
MAX_TOML_BYTES = 256 * 1024
MAX_TURNS = 100_000
_KNOWN: dict[str, dict[str, str]] = {
    "agent": {"timeout_sec": _NUM, "max_turns": _INT},
    "verifier": {"timeout_sec": _NUM, "env": _ENV, "reward_range": _RANGE},
    "solution": {"env": _ENV},
    "environment": {"cpus": _NUM, "memory_mb": _INT, "memory": _STR, "storage_mb": _INT,
                    "storage": _STR, "allow_internet": _BOOL, "allow_network": _BOOL, "env": _ENV,
                    "workdir": _STR, "required_env_keys": _STRS, "gpus": _INT,
                    "docker_image": _STR, "os": _STR, "network_mode": _STR,
                    "allowed_hosts": _STRS},
}
# Harbor's [environment] network_mode (docs/containers.md): the newer spelling of allow_internet.
# "allowlist" cannot be narrowed to its hosts here: it needs network (a trial network of its own,
# only where the run allows internet), and an empty allowlist denies all egress, as in Harbor.
NETWORK_MODES = ("public", "no-network", "allowlist")
_TOP = {"version": _STR, "schema_version": _STR}
_METADATA_USED = {"family", "category", "difficulty", "tags"}
# known to Harbor, with no local meaning: listed as ignored with the reason
_NO_LOCAL_MEANING = {
    "agent.user": "the agent always runs as an unprivileged per-trial uid here",
    "verifier.user": "the verifier always runs as an unprivileged uid here",
    "environment.build_timeout_sec": "the local backend builds nothing (the container backend applies it)",
    "environment.gpu_types": "no GPU is given to trials",
    "environment.mcp_servers": "the local backend starts no MCP server (the container backend does)",
    "agent.network_mode": "one network setting per trial here: [environment] network_mode",
    "verifier.network_mode": "the verifier runs without network here, always",
    "environment.healthcheck": "the local backend starts no services to check",
    "environment.skills_dir": "agent skills are not copied here",
}


@dataclass(frozen=True)
class TomlReport:
    """One task.toml, read: the raw data, what was ignored, and every problem found."""

    data: dict[str, Any]
    ignored: tuple[str, ...] = ()          # "key (why)" per ignored key, in file order
    problems: tuple[tuple[str, str], ...] = ()   # (dotted key, message)
    steps: tuple[str, ...] = field(default=())    # names of [[steps]] (refused)

    def error(self, source: str) -> TaskError:
        key, _ = self.problems[0]
        text = "; ".join(m for _, m in self.problems)
        return TaskError(f"{source}: {text}", file=source, key=key,
                         problems=[k for k, _ in self.problems])


def parse_size_mb(value: str) -> int:
    """Harbor's deprecated ``memory``/``storage`` strings: "4G", "512M", "2048K" -> MiB."""
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    units = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if not text or text[-1] not in units:
        raise ValueError(f"{value!r} is not a size like '4G' or '512M'")
    mb = float(text[:-1]) * units[text[-1]]
    if not math.isfinite(mb) or mb <= 0:
        raise ValueError(f"{value!r} must be a positive size")
    return max(1, int(mb))


def _type_ok(kind: str, v: Any) -> bool:
    if kind == _NUM:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if kind == _INT:
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == _STR:
        return isinstance(v, str)
    if kind == _BOOL:
        return isinstance(v, bool)
    if kind == _ENV:   # a name a process environment can hold (no '=', issue #51), a value without NUL
        return isinstance(v, dict) and all(isinstance(k, str) and ENV_NAME.fullmatch(k) is not None
                                           and isinstance(x, str) and "\0" not in x for k, x in v.items())
    if kind == _RANGE:
        return (isinstance(v, list) and len(v) == 2 and all(_type_ok(_NUM, x) for x in v)
                and v[0] < v[1])
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def read_task_toml(text: str, *, source: str = "task.toml") -> TomlReport:
    """Sort every key of a task.toml into applied / ignored / problems (see module doc).
    Only unparsable TOML raises (there is nothing to sort)."""
    bound = (f"{len(text)} characters (at most {MAX_TOML_BYTES})" if len(text) > MAX_TOML_BYTES
             else check_nesting(text))
    if bound:
        raise TaskError(f"{source}: {bound}; refusing it unparsed", file=source, key=None)
    try:
        data = tomllib.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:   # TOMLDecodeError, int digits
        raise TaskError(f"{source}: not valid TOML ({short(e, 200)}); fix the syntax", file=source,
                        key=None) from None
    ignored: list[str] = []
    problems: list[tuple[str, str]] = []
    for key, value in data.items():
        if key in _TOP:
            if not _type_ok(_TOP[key], value):
                problems.append((key, f"{key} must be a {_TOP[key]}, got {value!r:.40}"))
        elif key == "metadata":
            _metadata(value, ignored, problems)
        elif key == "steps":
            pass   # handled below: a refusal with the step names
        elif key in _KNOWN:
            _section(key, value, ignored, problems)
        else:
            ignored.append(f"{key} (not used by t1ops)")
    steps = _steps(data.get("steps"), problems)
    _values(data, problems)
    _network_mode(data, problems)
    return TomlReport(data, tuple(ignored), tuple(problems), steps)


def _network_mode(data: dict[str, Any], problems: list[tuple[str, str]]) -> None:
    """Fold ``[environment] network_mode`` into ``allow_internet`` (what every backend reads):
    public -> true, no-network -> false, allowlist -> true iff it names a host. A value
    outside Harbor's three, or one that contradicts a declared allow_internet, is a problem."""
    env = data.get("environment")
    if not isinstance(env, dict) or not isinstance(env.get("network_mode"), str):
        return
    mode = env["network_mode"]
    if mode not in NETWORK_MODES:
        problems.append(("environment.network_mode", f"environment.network_mode = {short(mode, 40)!r} "
                         f"must be one of {', '.join(NETWORK_MODES)}"))
        return
    hosts = env.get("allowed_hosts")
    wants = mode == "public" or (mode == "allowlist" and bool(hosts) and _type_ok(_STRS, hosts))
    declared = env.get("allow_internet", env.get("allow_network"))
    if isinstance(declared, bool) and declared != wants:
        problems.append(("environment.network_mode", f"environment.network_mode = {mode!r} "
                         f"contradicts allow_internet = {str(declared).lower()}; keep one of them"))
    elif declared is None:
        env["allow_internet"] = wants


def _metadata(value: Any, ignored: list[str], problems: list[tuple[str, str]]) -> None:
    if not isinstance(value, dict):
        problems.append(("metadata", f"[metadata] must be a table, got {type(value).__name__}"))
        return
    for k, v in value.items():
        if k not in _METADATA_USED:
            ignored.append(f"metadata.{k} (free-form metadata, kept)")
        elif k == "tags" and not _type_ok(_STRS, v):
            problems.append(("metadata.tags", "metadata.tags must be a list of strings"))
        elif k != "tags" and not isinstance(v, str):
            problems.append((f"metadata.{k}", f"metadata.{k} must be a string, got {v!r:.40}"))


def _section(name: str, value: Any, ignored: list[str], problems: list[tuple[str, str]]) -> None:
    if not isinstance(value, dict):
        problems.append((name, f"[{name}] must be a table, got {type(value).__name__}"))
        return
    for k, v in value.items():
        dotted = f"{name}.{k}"
        kind = _KNOWN[name].get(k)
        if kind is None:
            why = _NO_LOCAL_MEANING.get(dotted, "not used by t1ops")
            ignored.append(f"{dotted} ({why})")
        elif not _type_ok(kind, v):
            problems.append((dotted, f"{dotted} must be a {kind}, got {type(v).__name__} {v!r:.40}"))


def _steps(steps: Any, problems: list[tuple[str, str]]) -> tuple[str, ...]:
    if steps is None:
        return ()
    names = tuple(str(s.get("name", f"#{i + 1}")) if isinstance(s, dict) else f"#{i + 1}"
                  for i, s in enumerate(steps if isinstance(steps, list) else [steps]))
    problems.append(("steps", f"multi-step task ([[steps]] {', '.join(names)}) is not supported: "
                     "t1ops runs one agent episode and one verifier per trial; split the steps "
                     "into separate tasks"))
    return names


def _values(data: dict[str, Any], problems: list[tuple[str, str]]) -> None:
    """Range checks on keys whose type is already right."""
    def get(sec: str, key: str) -> Any:
        table = data.get(sec)
        return table.get(key) if isinstance(table, dict) else None

    for sec in ("agent", "verifier"):
        v = get(sec, "timeout_sec")
        if _type_ok(_NUM, v) and not 0 < v <= MAX_TIMEOUT_S:
            problems.append((f"{sec}.timeout_sec", f"{sec}.timeout_sec = {v} must be in "
                             f"(0, {MAX_TIMEOUT_S:g}] seconds"))
    cap = host_capacity()
    for key in ("cpus", "memory_mb", "storage_mb", "max_turns", "memory", "storage"):
        sec = "agent" if key == "max_turns" else "environment"
        v = get(sec, key)
        if isinstance(v, str) and key in ("memory", "storage"):
            try:
                v = parse_size_mb(v)
            except ValueError as e:
                problems.append((f"environment.{key}", f"environment.{key}: {short(e, 120)}"))
                continue
        if not _type_ok(_NUM, v):
            continue
        if v <= 0:
            problems.append((f"{sec}.{key}", f"{sec}.{key} = {short(v, 40)} must be > 0"))
        elif v > cap[key]:
            problems.append((f"{sec}.{key}", f"{sec}.{key} = {short(v, 40)} exceeds what this host can "
                             f"give ({cap[key]:g}); lower it"))
    keys = get("environment", "required_env_keys")
    if _type_ok(_STRS, keys) and not all(k.isidentifier() for k in keys):
        problems.append(("environment.required_env_keys",
                         f"environment.required_env_keys must be identifiers, got {keys!r:.80}"))
    gpus = get("environment", "gpus")
    if _type_ok(_INT, gpus) and not 0 <= gpus <= 1024:
        problems.append(("environment.gpus", f"environment.gpus = {short(gpus, 40)} must be in [0, 1024]"))
    workdir = get("environment", "workdir")
    if isinstance(workdir, str) and workdir_problem(workdir):
        problems.append(("environment.workdir", f"environment.workdir: {workdir_problem(workdir)}"))
    os_name = get("environment", "os")
    if isinstance(os_name, str) and os_name.lower() != "linux":
        problems.append(("environment.os", f"environment.os = {os_name!r}: only linux tasks run here"))


def host_capacity() -> dict[str, float]:
    """Upper bounds of declared resources on this host: its CPUs, its RAM (a trial's tmpfs
    storage lives in RAM too), and a turn count no episode reaches."""
    import psutil

    mem_mb = psutil.virtual_memory().total / 2**20
    cpus = float(os.cpu_count() or 1)
    return {"cpus": cpus, "memory_mb": mem_mb, "memory": mem_mb, "storage_mb": mem_mb,
            "storage": mem_mb, "max_turns": MAX_TURNS}


# where a WORKDIR may not be: the jail binds the host's system trees and its own mounts there
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/logs",
               "/proc", "/root", "/run", "/sbin", "/solution", "/sys", "/tests", "/tmp", "/usr",
               "/var/tmp", "/dev/shm")
MAX_PATH_CHARS = 256


def workdir_problem(workdir: str, system_dirs: tuple[str, ...] = SYSTEM_DIRS) -> str | None:
    """Why ``workdir`` cannot be a trial's working directory, or None: it must be a plain
    absolute path outside ``system_dirs`` (the local jail's: the host's system trees and the
    sandbox's own mounts; the container backend passes its own mounts)."""
    import posixpath

    if len(workdir) > MAX_PATH_CHARS or not workdir.startswith("/") or "\x00" in workdir:
        return f"{short(workdir, 80)!r} must be an absolute path of at most {MAX_PATH_CHARS} characters"
    norm = posixpath.normpath(workdir)
    if norm != workdir.rstrip("/") or ".." in workdir.split("/") or norm == "/":
        return f"{short(workdir, 80)!r} must be a normalized path below / (no '..', no '//')"
    for d in system_dirs:
        if norm == d or norm.startswith(d + "/") or d.startswith(norm + "/"):
            return (f"{short(workdir, 80)!r} is or holds the system location {d}: the sandbox binds "
                    "the host's tree or its own mounts there; use a directory like /app")
    return None


_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def template_vars(env: dict[str, str]) -> list[str]:
    """Host variables an ``[environment.env]`` table names in ``${VAR}`` / ``${VAR:-default}``."""
    return sorted({m.group(1) for v in env.values() for m in _TEMPLATE.finditer(v)})


def resolve_env(env: dict[str, str], environ: Mapping[str, str],
                allow: frozenset[str] | set[str] = frozenset()) -> tuple[dict[str, str], dict[str, str]]:
    """Harbor's ``${VAR}`` / ``${VAR:-default}`` templates, resolved from ``environ`` for the
    names in ``allow`` only (``[sandbox] env_allow``): any other name reads as unset. Returns
    (env, {VAR: value} of every value taken from ``environ``: the caller redacts them like
    secrets). A ``${VAR}`` without default that is not allowed, or allowed and unset, is a
    TaskError naming the fix."""
    taken: dict[str, str] = {}

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        value = environ.get(name) if name in allow else None
        if value:
            taken[name] = value
            return value
        if default is not None:
            return default
        why = ("is not set" if name in allow else "is not in [sandbox] env_allow (add it there to "
               "pass the campaign's value to tasks)")
        raise TaskError(f"[environment.env] needs ${{{name}}}, which {why}", key="environment.env",
                        missing=[name])

    return {k: _TEMPLATE.sub(sub, v) for k, v in env.items()}, taken


def parse_task_toml(text: str, *, source: str = "task.toml") -> dict[str, Any]:
    """The task.toml data if it has no problem, else a TaskError naming every problem
    (``context['key']`` is the first one's dotted key). Ignored keys are fine."""
    report = read_task_toml(text, source=source)
    if report.problems:
        raise report.error(source)
    return report.data
