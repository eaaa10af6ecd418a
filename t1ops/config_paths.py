"""Where a campaign config's paths point (docs/campaign.md, "Paths in a config").

A relative path written in a config file resolves against the directory of that file, so
``t1ops run /anywhere/examples/tiny/campaign.toml`` reads the same pool from any working
directory. A relative path given with ``--set`` resolves against the working directory (where it
was typed); a default resolves against the repository (the bundled examples). ``run.out_dir`` is
an output: it stays relative to the working directory (``--out`` overrides it).
:func:`resolve` rewrites the input paths to absolute ones before validation;
:func:`check_files` says which of them do not exist, naming the resolved path and why it is there.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# dotted key -> what it names; every input path of the campaign schema
INPUT_PATHS: dict[str, str] = {
    "run.plan": "file",
    "rollout.tasks_dir": "dir",
    "eval.tasks_dir": "dir",
    "harness.program_dir": "dir",
    "trainer.critic_warm_load": "dir",
    "model.path": "dir",
}
OUTPUT_PATHS = ("run.out_dir",)

RELATIVE_NOTE = "A relative path resolves against the config file's directory (--set: the working directory)."


@dataclass(frozen=True)
class ResolvedPath:
    key: str
    written: str   # as in the file, the --set or the default
    path: str      # absolute
    source: str    # "file", "--set" or "default"

    def why(self) -> str:
        if self.written == self.path:
            return f"{self.key} = {self.written!r}"
        base = {"file": "the config file's directory", "--set": "the working directory",
                "default": "the repository (the default)"}[self.source]
        return f"{self.key} = {self.written!r} ({self.source}), relative to {base}"


def _get(data: dict, key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set(data: dict, key: str, value: Any) -> None:
    *sections, leaf = key.split(".")
    node = data
    for s in sections:
        node = node.setdefault(s, {})
    node[leaf] = value


def resolve(data: dict, *, file_dir: Path, set_keys: set[str], defaults: dict[str, Any],
            cwd: Path | None = None) -> dict[str, ResolvedPath]:
    """Make every relative input path in ``data`` absolute (in place); the default of a path the
    data does not set is resolved too and written in. Returns each resolved path by key."""
    cwd = cwd or Path.cwd()
    out: dict[str, ResolvedPath] = {}
    for key in INPUT_PATHS:
        value = _get(data, key)
        source = "--set" if key in set_keys else "file"
        if value is None:
            value, source = defaults.get(key), "default"
        if not isinstance(value, str) or not value:
            continue  # None (not set) or a wrong type, which validation reports
        if "\x00" in value:
            from t1ops.errors import ConfigError

            raise ConfigError(f"{key} = {value!r}: a path cannot contain a NUL byte", key=key)
        base = {"file": file_dir, "--set": cwd, "default": REPO}[source]
        path = Path(value).expanduser()
        absolute = str(path if path.is_absolute() else (base / path).resolve())
        _set(data, key, absolute)
        out[key] = ResolvedPath(key, value, absolute, source)
    return out


def check_files(cfg, resolved: dict[str, ResolvedPath] | None = None) -> list[str]:
    """One line per input path of ``cfg`` that names nothing of its kind (the harness directory
    only when ``rollout.agent = "command"`` runs it)."""
    from t1ops.overrides import dotted

    flat = dotted(cfg.model_dump())
    problems = []
    for key, kind in INPUT_PATHS.items():
        value = flat.get(key)
        if value is None or (key == "harness.program_dir" and cfg.rollout.agent != "command"):
            continue
        path = Path(value)
        ok = path.is_file() if kind == "file" else path.is_dir()
        if ok:
            continue
        r = (resolved or {}).get(key)
        why = f" ({r.why()})" if r and r.written != r.path else ""
        state = "does not exist" if not path.exists() else f"is not a {'file' if kind == 'file' else 'directory'}"
        problems.append(f"{key}: {kind if kind == 'file' else 'directory'} {path} {state}{why}")
    return problems
