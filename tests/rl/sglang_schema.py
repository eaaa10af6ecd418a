"""Read SGLang's request classes out of a real ``sglang`` wheel, without installing it.

``io_struct.py`` cannot be imported from the unpacked wheel here: it imports ``msgspec``,
``zmq`` and half of ``sglang.srt`` (scheduler, LoRA, multimodal), none of which the shared
venv has or may get. So the request classes are read with :mod:`ast` from the wheel's own
source: each class's annotated fields (its bases' included) with their annotations and whether
they have a default, and payloads are checked against that: every key is a field of the class,
every field without a default is present, and each value fits the field's annotation
(str/int/float/bool, Optional, Union, List/Set, Literal, Dict/Any).
"""
from __future__ import annotations

import ast
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# .ci/run downloads the wheel into the venv (``<venv>/sglang-wheel``); README "Set up" says how by hand
WHEEL_DIRS = (os.environ.get("T1OPS_SGLANG_WHEEL_DIR", ""), os.path.join(sys.prefix, "sglang-wheel"),
              "/tmp/sglang-wheel")


def find_wheel(version: str) -> Path | None:
    for d in WHEEL_DIRS:
        if d and Path(d).is_dir():
            found = sorted(Path(d).glob(f"sglang-{version}-*.whl"))
            if found:
                return found[0]
    return None


@dataclass(frozen=True)
class Field:
    annotation: ast.expr
    has_default: bool


def read_classes(wheel: Path, member: str) -> dict[str, tuple[list[str], dict[str, Field]]]:
    """Class name -> (base names, own annotated fields) of one source file in the wheel."""
    with zipfile.ZipFile(wheel) as z:
        tree = ast.parse(z.read(member).decode())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            fields = {}
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    fields[stmt.target.id] = Field(stmt.annotation, stmt.value is not None)
            out[node.name] = ([b.id for b in node.bases if isinstance(b, ast.Name)], fields)
    return out


def fields_of(classes: dict, name: str) -> dict[str, Field]:
    bases, own = classes[name]
    merged: dict[str, Field] = {}
    for base in bases:
        if base in classes:
            merged.update(fields_of(classes, base))
    merged.update(own)
    return merged


def _fits(value: Any, ann: ast.expr) -> bool:
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # a string annotation
        return _fits(value, ast.parse(ann.value, mode="eval").body)
    if isinstance(ann, ast.Name):
        simple = {"str": str, "float": (int, float), "dict": dict, "list": list}
        if ann.id == "int":
            return isinstance(value, int) and not isinstance(value, bool)
        if ann.id == "bool":
            return isinstance(value, bool)
        if ann.id in simple:
            return isinstance(value, simple[ann.id]) and not isinstance(value, bool)
        return ann.id == "Any"
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        return _fits(value, ann.left) or _fits(value, ann.right)
    if isinstance(ann, ast.Constant) and ann.value is None:
        return value is None
    if isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name):
        head, args = ann.value.id, ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if head == "Optional":
            return value is None or _fits(value, args[0])
        if head == "Union":
            return any(_fits(value, a) for a in args)
        if head in ("List", "Set", "list", "set"):
            return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
        if head == "Literal":
            return value in [a.value for a in args if isinstance(a, ast.Constant)]
        if head in ("Dict", "dict"):
            return isinstance(value, dict)
        if head == "Annotated":
            return _fits(value, args[0])
    return True  # a type this checker does not model (a project class): not judged


def check_payload(classes: dict, name: str, payload: dict) -> list[str]:
    """Problems of ``payload`` as a body of SGLang's ``name`` (empty list: it fits)."""
    fields = fields_of(classes, name)
    problems = [f"{name}: unknown field {k!r}" for k in payload if k not in fields]
    problems += [f"{name}: required field {k!r} missing" for k, f in fields.items()
                 if not f.has_default and k not in payload]
    problems += [f"{name}.{k}: {payload[k]!r} does not fit {ast.unparse(fields[k].annotation)}"
                 for k in payload if k in fields and not _fits(payload[k], fields[k].annotation)]
    return problems
