"""Helpers for fuzzing TOML-loaded config trees: field listing, value strategies, a TOML writer.

The writer covers what the config trees hold (two levels of tables; strings,
numbers, booleans, arrays, inline tables); ``None`` values are left out
because TOML has no null and every nullable field defaults to ``None``.
"""
from __future__ import annotations

import math
import typing
from typing import Any

import annotated_types as at
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from t1ops.config import Section

_INT_MAX = 2**40  # upper end for unbounded ints: large, and still a TOML 64-bit integer


def fields_of(model: type[BaseModel]) -> list[tuple[str, str, FieldInfo]]:
    """(section, key, field) for every leaf field of a two-level config tree."""
    out = []
    for section, sf in model.model_fields.items():
        sub = sf.annotation
        if isinstance(sub, type) and issubclass(sub, Section):
            out.extend((section, key, f) for key, f in sub.model_fields.items())
    return out


def _bounds(info: FieldInfo) -> dict[str, float]:
    b: dict[str, float] = {}
    for m in info.metadata:
        for name in ("ge", "gt", "le", "lt"):
            if isinstance(m, getattr(at, name.capitalize())):
                b[name] = getattr(m, name)
    return b


def _base(ann: Any) -> tuple[Any, bool]:
    """(annotation without ``None``, whether ``None`` is allowed)."""
    args = typing.get_args(ann)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return ann, False


def value_for(info: FieldInfo, out_of_range: bool = False) -> st.SearchStrategy | None:
    """Values valid for one field, or (``out_of_range``) just past one of its bounds (None: no bound)."""
    ann, nullable = _base(info.annotation)
    b = _bounds(info)
    if out_of_range:
        if ann not in (int, float) or not b:
            return None
        step = 1 if ann is int else 1e-3
        beyond = [b["ge"] - step] if "ge" in b else [b["gt"]] if "gt" in b else []
        beyond += [b["le"] + step] if "le" in b else [b["lt"]] if "lt" in b else []
        return st.sampled_from([ann(v) for v in beyond])
    if ann is bool:
        s = st.booleans()
    elif ann is int:
        lo = b.get("ge", b.get("gt", -_INT_MAX - 1) + 1)
        hi = b.get("le", b.get("lt", _INT_MAX + 1) - 1)
        s = st.integers(int(lo), int(hi))
    elif ann is float:
        s = st.floats(min_value=b.get("ge", b.get("gt")), max_value=b.get("le", b.get("lt")),
                      exclude_min="gt" in b, exclude_max="lt" in b, allow_nan=False, allow_infinity=False)
    elif ann is str:
        pattern = next((m.pattern for m in info.metadata if getattr(m, "pattern", None)), None)
        lo = next((m.min_length for m in info.metadata if isinstance(m, at.MinLen)), 0)
        hi = next((m.max_length for m in info.metadata if isinstance(m, at.MaxLen)), max(10, lo))
        s = st.from_regex(pattern, fullmatch=True) if pattern else st.text(min_size=lo, max_size=hi)
    elif typing.get_origin(ann) is typing.Literal:
        s = st.sampled_from(typing.get_args(ann))
    elif typing.get_origin(ann) is list:
        min_len = next((m.min_length for m in info.metadata if isinstance(m, at.MinLen)), 0)
        (elem,) = typing.get_args(ann)
        item = _model_dicts(elem) if isinstance(elem, type) and issubclass(elem, BaseModel) else st.text(min_size=1, max_size=6)
        s = st.lists(item, min_size=min_len, max_size=max(3, min_len))
    elif typing.get_origin(ann) is dict:  # e.g. an env table
        s = st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True), st.text(max_size=6), max_size=3)
    elif isinstance(ann, type) and issubclass(ann, BaseModel):  # a nested section, e.g. [trainer.parallel]
        s = _model_dicts(ann)
    else:
        raise AssertionError(f"no strategy for {info.annotation}")
    return st.none() | s if nullable else s


def _model_dicts(model: type[BaseModel]) -> st.SearchStrategy[dict]:
    """Dicts valid field by field for a nested model: its required fields always, others sometimes."""
    fields = model.model_fields.items()
    return st.fixed_dictionaries({k: value_for(f) for k, f in fields if f.is_required()},
                                 optional={k: value_for(f) for k, f in fields if not f.is_required()})


def valid_sections(model: type[BaseModel], max_fields: int = 6) -> st.SearchStrategy[dict]:
    """Dicts setting a few fields of ``model`` to values valid field by field."""
    fields = fields_of(model)

    @st.composite
    def build(draw) -> dict:
        chosen = draw(st.lists(st.sampled_from(fields), max_size=max_fields, unique_by=lambda f: f[:2]))
        data: dict = {}
        for section, key, info in chosen:
            value = draw(value_for(info))
            if value is not None:
                data.setdefault(section, {})[key] = value
        return data

    return build()


def _string(s: str) -> str:
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _value(v: Any, strict: bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x, strict) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_string(k)} = {_value(x, strict)}" for k, x in v.items() if x is not None) + "}"
    if v is None and not strict:
        return '""'
    raise AssertionError(f"cannot write {v!r} as TOML")


def to_toml(data: dict, strict: bool = True) -> str:
    """TOML text for ``{section: {key: value}}``; ``strict=False`` also writes odd values (null as "")."""
    lines = []
    for section, body in data.items():
        lines.append(f"[{_string(section)}]")
        for key, v in body.items():
            if v is not None or not strict:
                lines.append(f"{_string(key)} = {_value(v, strict)}")
    return "\n".join(lines) + "\n"
