"""Strict readers of JSON payloads: each names the field it read and never fills in a default.

Shared by the SGLang schemas (:mod:`rl.engines.protocol`, :mod:`rl.engines.protocol_control`,
:mod:`rl.engines.protocol_weights`): a malformed payload raises :class:`~rl.errors.ParseError`
naming the field, because a silently repaired payload would corrupt the training data.
"""
from __future__ import annotations

import math
from typing import Any

from rl.errors import ParseError


def require(d: Any, key: str, where: str) -> Any:
    """``d[key]`` of a JSON object ``d`` (``where`` names it in the error)."""
    if not isinstance(d, dict):
        raise ParseError(f"{where}: expected a JSON object, got {type(d).__name__}", field=where)
    if key not in d:
        raise ParseError(f"{where}: missing field {key!r} (present: {sorted(d)})",
                         field=f"{where}.{key}")
    return d[key]


def as_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ParseError(f"{name}: expected an integer, got {v!r}", field=name)
    return v


def as_count(v: Any, name: str) -> int:
    if as_int(v, name) < 0:
        raise ParseError(f"{name}: expected a count >= 0, got {v!r}", field=name)
    return v


def as_bool(v: Any, name: str) -> bool:
    if not isinstance(v, bool):
        raise ParseError(f"{name}: expected true/false, got {v!r}", field=name)
    return v


def as_num(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ParseError(f"{name}: expected a finite number, got {v!r}", field=name)
    return float(v)


def as_str(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise ParseError(f"{name}: expected a string, got {v!r}", field=name)
    return v


def as_ids(v: Any, name: str) -> tuple[int, ...]:
    if not isinstance(v, list):
        raise ParseError(f"{name}: expected a list of token ids, got {type(v).__name__}", field=name)
    for i, t in enumerate(v):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ParseError(f"{name}[{i}]: expected a non-negative token id, got {t!r}", field=name,
                             index=i)
    return tuple(v)


def or_default(v: Any, default: Any) -> Any:
    """``default`` for a JSON null only: a falsy value of the wrong type (0, "", false) stays an error."""
    return default if v is None else v


def as_obj(d: Any, where: str) -> dict:
    if not isinstance(d, dict):
        raise ParseError(f"{where}: expected a JSON object, got {type(d).__name__}", field=where)
    return d


def no_unknown(d: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ParseError(f"{where}: unsupported field(s) {unknown}; supported: {sorted(allowed)}",
                         field=where, unknown=unknown)


def opt_str(v: Any, name: str) -> str | None:
    return None if v is None else as_str(v, name)
