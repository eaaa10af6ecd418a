"""Dotted config overrides from the command line: ``t1ops run CFG --set trainer.actor_lr=1e-6``.

A value is read as a TOML value (``1e-6``, ``true``, ``"text"``, ``[1, 2]``); anything that is not
one is a bare string (``--set run.mode=fully_async``). The pairs are set into the file's data
before validation (:func:`t1ops.config.load_toml`), so an override is checked exactly like the
file: strict types, ranges, unknown keys and renamed keys (``t1ops.config.RENAMED_KEYS``) are
errors naming the key.
"""
from __future__ import annotations

import tomllib
from typing import Any

from rl.agent.bounded import check_nesting, short
from t1ops.errors import ConfigError


def parse_value(raw: str) -> Any:
    """A TOML value, or the text itself when it is not one."""
    deep = check_nesting(raw)
    if deep:   # tomllib recurses per level (issue #51)
        raise ConfigError(f"--set value {short(raw, 60)!r} {deep}", key="--set")
    try:
        return tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return raw.strip()


def parse_assignments(assignments: list[str]) -> list[tuple[str, Any]]:
    """``["a.b=1", ...]`` -> ``[("a.b", 1), ...]``; ConfigError on a malformed one."""
    out = []
    for a in assignments:
        key, sep, raw = a.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {a!r}: expected KEY=VALUE with a dotted key, e.g. --set trainer.actor_lr=1e-6",
                              key=key or a)
        out.append((key, parse_value(raw)))
    return out


def apply_overrides(data: dict, pairs: list[tuple[str, Any]]) -> dict:
    """Set every (dotted key, value) into ``data`` (creating sections); returns ``data``."""
    for key, value in pairs:
        *sections, leaf = key.split(".")
        node = data
        for i, name in enumerate(sections):
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: '{'.'.join(sections[:i + 1])}' is a value, not a section",
                                  key=key)
        node[leaf] = value
    return data


def dotted(d: dict, prefix: str = "") -> dict[str, Any]:
    """A nested table as ``{"section.key": value}``: the names ``--set`` takes (resume and
    ``t1ops compare`` diff configs by them)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
