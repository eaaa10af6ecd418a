"""Config errors a user can act on: the full dotted key, "did you mean", the command that prints
the schema, and the kind of file expected when another kind was given (a campaign config handed
to ``t1ops preflight``). Never the validator's internals (``'<root>': Value error, ...``).

Every root model of a TOML file declares ``FILE_KIND`` (:class:`FileKind`): what the file is,
the command that prints its schema, an example and the command that takes it
(``t1ops.config.root_models`` lists them). :func:`explain` turns a pydantic
``ValidationError`` into the lines of the :class:`~t1ops.errors.ConfigError` that
:func:`t1ops.config.parse_config` raises.
"""
from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class FileKind:
    """What a config file is, for error messages."""

    name: str       # "campaign config"
    schema: str     # the command that prints its keys: "t1ops config"
    example: str    # a shipped file of the kind
    used_by: str    # the command that takes it: "t1ops run"


def file_kind(model: type[BaseModel]) -> FileKind | None:
    return getattr(model, "FILE_KIND", None)


def _section_model(ann: Any) -> type[BaseModel] | None:
    """The model a field holds (a section, an optional section or a list of them), else None."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in typing.get_args(ann):
        found = _section_model(arg)
        if found is not None:
            return found
    return None


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section model holding the key at ``loc`` (its parent), or None past a plain value."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # a list item: the list's item model is already current
        field = current.model_fields.get(part) if current else None
        current = _section_model(field.annotation) if field else None
        if current is None:
            return None
    return current


def all_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of ``model`` (sections expanded)."""
    out = []
    for name, field in model.model_fields.items():
        sub = _section_model(field.annotation)
        if sub is not None and isinstance(field.annotation, type):
            out += all_keys(sub, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def did_you_mean(model: type[BaseModel], loc: tuple) -> str | None:
    """The dotted key a misspelt or misplaced ``loc`` most likely meant, or None."""
    parent = _model_at(model, loc)
    leaf = str(loc[-1])
    prefix = ".".join(str(p) for p in loc[:-1] if not isinstance(p, int))
    if parent is not None:
        close = difflib.get_close_matches(leaf, list(parent.model_fields), n=1, cutoff=0.7)
        if close:
            return f"{prefix}.{close[0]}" if prefix else close[0]
    keys = all_keys(model)
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]  # the right name in another section
    if same_leaf:
        return " or ".join(f"'{k}'" for k in same_leaf[:3]).strip("'")
    close = difflib.get_close_matches(".".join(str(p) for p in loc if not isinstance(p, int)), keys, n=1, cutoff=0.75)
    return close[0] if close else None


def other_kind(model: type[BaseModel], data: dict, roots: list[type[BaseModel]]) -> FileKind | None:
    """The kind of file ``data`` is when it is not ``model``'s: most of its sections are unknown
    to ``model`` and all of them belong to another of the ``roots`` (every root model of a file)."""
    sections = [k for k, v in data.items() if isinstance(v, dict)]
    unknown = [k for k in sections if k not in model.model_fields]
    if not sections or len(unknown) * 2 < len(sections):
        return None
    for other in roots:
        if other is not model and all(k in other.model_fields for k in sections):
            return file_kind(other)
    return None


def _clean(msg: str) -> str:
    """A model validator's message without pydantic's 'Value error, ' prefix."""
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg


def explain(err: ValidationError, source: str, model: type[BaseModel], data: Any,
            renamed: dict[str, str], roots: list[type[BaseModel]]) -> str:
    """The lines of the ConfigError for ``err`` raised validating ``data`` from ``source``; ``roots``:
    the root model of every kind of config file (to say which kind ``data`` is instead)."""
    kind = file_kind(model)
    schema = f"`{kind.schema}`" if kind else "the schema"
    if kind and isinstance(data, dict):
        other = other_kind(model, data, roots)
        if other is not None:
            return (f"{source} is a {other.name}, not a {kind.name} (its sections "
                    f"[{'], ['.join(k for k, v in data.items() if isinstance(v, dict))}] are a {other.name}'s): "
                    f"this command takes a {kind.name}, e.g. {kind.example} (keys: {schema}); "
                    f"a {other.name} goes to `{other.used_by}`")
    lines = [f"invalid {kind.name if kind else 'config'} {source}:"]
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc)
        if e["type"] == "extra_forbidden" and key in renamed:
            lines.append(f"  key '{key}' was renamed: use '{renamed[key]}' (see {schema})")
            continue
        if e["type"] == "extra_forbidden":
            guess = did_you_mean(model, loc)
            hint = f"did you mean '{guess}'? " if guess else ""
            lines.append(f"  unknown key '{key}' ({hint}every key: {schema})")
            continue
        if not loc or (e["type"] == "value_error" and isinstance(e.get("input"), dict)):
            # a check across keys (a model validator): its message names them
            lines.append(f"  {_clean(e['msg'])}")
            continue
        ctx = e.get("ctx") or {}
        bounds = ", ".join(f"{k} {v}" for k, v in ctx.items() if k in ("ge", "gt", "le", "lt", "expected"))
        allowed = f" (allowed: {bounds})" if bounds else ""
        got = "" if isinstance(e.get("input"), dict) else f"; got {e.get('input')!r}"  # a section: msg names it
        lines.append(f"  '{key}': {_clean(e['msg'])}{got}{allowed}")
    return "\n".join(lines)
