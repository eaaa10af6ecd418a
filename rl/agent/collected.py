"""The tests a task's own files can give: what a CTRF report may count (docs/sandbox.md "Verdict").

Rule (issue #51, class 2): a verdict is the set of tests collected from the task's own
``tests/`` snapshot, read statically here (``ast``; no code of the task or the agent runs), so
nothing the tested code does at verification time can add a test:

- a test is a function named like pytest collects it (``python_functions``, default ``test``)
  at module level, or a method of a collected class (``python_classes``, default ``Test``;
  nested classes, ``unittest.TestCase`` subclasses whatever their name, and methods inherited
  from a class of the same file included), in a ``.py``
  file of ``tests/`` other than ``conftest.py``; its node id is ``file.py::[Class::]name``;
- its number of parameter sets is the product of its ``parametrize`` marks (on the function,
  its classes and the module's ``pytestmark``) and of the ``params`` of the fixtures it uses
  (defined in its file or a ``conftest.py``, transitively), each a literal list, tuple, set,
  ``range(n)`` or a module-level name bound to one;
- where t1ops cannot count them (values computed at run time, a ``pytest_generate_tests``
  hook, an unreadable file) the function is *one* test, passed only when every instance the
  report lists passed: so ``passed`` never exceeds what t1ops counted, whatever the report says.
"""
from __future__ import annotations

import ast
import configparser
import fnmatch
import posixpath
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Mapping

UNCOUNTED = None   # a function whose parameter sets t1ops cannot count statically
MAX_PARAM_SETS = 100_000   # a literal past this is not a real task's parametrization


@dataclass(frozen=True)
class Collected:
    """``functions``: node id without parameters -> its number of parameter sets (1: not
    parametrized; None: parametrized in a way t1ops cannot count, so it counts once)."""

    functions: dict[str, int | None]


def _patterns(snapshot: Mapping[str, bytes]) -> tuple[list[str], list[str]]:
    """(python_functions, python_classes) of the task's own ``tests/pytest.ini``, else pytest's defaults."""
    funcs, classes = ["test"], ["Test"]
    raw = snapshot.get("pytest.ini")
    if raw is not None:
        cp = configparser.ConfigParser(interpolation=None)
        try:
            cp.read_string(raw.decode("utf-8", errors="replace"))
        except configparser.Error:
            return funcs, classes
        if cp.has_section("pytest"):
            funcs = cp.get("pytest", "python_functions", fallback="test").split() or funcs
            classes = cp.get("pytest", "python_classes", fallback="Test").split() or classes
    return funcs, classes


def _matches(name: str, patterns: list[str]) -> bool:
    """pytest's rule: a pattern with a glob character is matched, any other is a prefix."""
    return any(fnmatch.fnmatchcase(name, p) if any(c in p for c in "*?[") else name.startswith(p)
               for p in patterns)


def _literal_len(node: ast.AST | None, names: Mapping[str, ast.AST]) -> int | None:
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return None if any(isinstance(e, ast.Starred) for e in node.elts) else len(node.elts)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and node.args and all(isinstance(a, ast.Constant) and type(a.value) is int for a in node.args)):
        try:
            return len(range(*(a.value for a in node.args)))
        except (ValueError, TypeError, OverflowError):
            return None
    return None


def _called(node: ast.AST, attr: str) -> ast.Call | None:
    """``node`` if it is a call of ``...<attr>(...)`` or ``<attr>(...)``."""
    if isinstance(node, ast.Call):
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr == attr) or (isinstance(f, ast.Name) and f.id == attr):
            return node
    return None


def _marks_factor(marks: list[ast.AST], names: Mapping[str, ast.AST]) -> tuple[int | None, set[str]]:
    """(product of the ``parametrize`` marks' lengths or None, the argnames they bind)."""
    factor: int | None = 1
    bound: set[str] = set()
    for mark in marks:
        call = _called(mark, "parametrize")
        if call is None:
            continue
        argnames = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "argnames"), None)
        if isinstance(argnames, ast.Constant) and isinstance(argnames.value, str):
            bound |= {a.strip() for a in argnames.value.split(",") if a.strip()}
        elif isinstance(argnames, (ast.List, ast.Tuple)):
            bound |= {e.value for e in argnames.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        values = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords
                                                               if k.arg == "argvalues"), None)
        n = _literal_len(values, names)
        factor = None if n is None or factor is None else factor * n
    return factor, bound


def _module_marks(tree: ast.Module) -> list[ast.AST]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return list(node.value.elts) if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
    return []


def _literals(tree: ast.Module) -> dict[str, ast.AST]:
    """Module-level names bound once to a value (``CASES = [...]``) that marks may refer to."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _arg_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]


class _Fixtures:
    """Fixture name -> (its ``params`` length or None, the fixtures it requests), for one scope."""

    def __init__(self) -> None:
        self.defs: dict[str, tuple[int | None, list[str]]] = {}

    def add(self, tree: ast.Module) -> None:
        names = _literals(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for dec in node.decorator_list:
                call = _called(dec, "fixture")
                if call is None and not (isinstance(dec, (ast.Attribute, ast.Name)) and
                                         getattr(dec, "attr", getattr(dec, "id", "")) == "fixture"):
                    continue
                params, name = 1, node.name
                for kw in (call.keywords if call is not None else []):
                    if kw.arg == "params":
                        params = _literal_len(kw.value, names)
                    elif kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        name = kw.value.value
                self.defs[name] = (params, [a for a in _arg_names(node) if a not in ("self", "request")])

    def factor(self, argnames: list[str], seen: frozenset[str] = frozenset()) -> int | None:
        out: int | None = 1
        for a in argnames:
            if a not in self.defs or a in seen:
                continue
            own, deps = self.defs[a]
            sub = self.factor(deps, seen | {a})
            out = None if own is None or sub is None or out is None else out * own * sub
        return out


def _parse(data: bytes) -> ast.Module | None:
    try:
        return ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def collect(snapshot: Mapping[str, bytes]) -> Collected:
    """The tests of a task's ``tests/`` snapshot (relative path -> bytes); see the module doc."""
    funcs, classes = _patterns(snapshot)
    trees = {rel: _parse(data) for rel, data in snapshot.items() if rel.endswith(".py")}
    out: dict[str, int | None] = {}
    for rel, tree in trees.items():
        if PurePosixPath(rel).name == "conftest.py" or tree is None:
            continue
        scope = _Fixtures()
        hooked = False
        for parent in [*PurePosixPath(rel).parents][::-1]:
            conf = trees.get(str(parent / "conftest.py").removeprefix("./"))
            if conf is not None:
                scope.add(conf)
                hooked |= any(getattr(n, "name", "") == "pytest_generate_tests" for n in conf.body)
        scope.add(tree)
        hooked |= any(getattr(n, "name", "") == "pytest_generate_tests" for n in tree.body)
        names = _literals(tree)
        _collect_body(rel, tree.body, _module_marks(tree), names, scope, hooked, funcs, classes, out, {})
    return Collected(out)


def _collect_body(prefix: str, body: list[ast.stmt], marks: list[ast.AST], names: Mapping[str, ast.AST],
                  scope: _Fixtures, hooked: bool, funcs: list[str], classes: list[str],
                  out: dict[str, int | None], module_classes: dict[str, ast.ClassDef]) -> None:
    module_classes = {**module_classes, **{n.name: n for n in body if isinstance(n, ast.ClassDef)}}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _matches(node.name, funcs):
            all_marks = [*marks, *node.decorator_list]
            factor, bound = _marks_factor(all_marks, names)
            fixtures = scope.factor([a for a in _arg_names(node) if a not in bound and a != "self"])
            n = None if hooked or factor is None or fixtures is None else factor * fixtures
            out[f"{prefix}::{node.name}"] = None if n is not None and n > MAX_PARAM_SETS else n
        elif isinstance(node, ast.ClassDef) and (_matches(node.name, classes) or _is_testcase(node)):
            members = list(node.body)
            for base in node.bases:   # inherited tests of a class of the same file
                if isinstance(base, ast.Name) and base.id in module_classes and base.id != node.name:
                    own = {getattr(m, "name", None) for m in members}
                    members += [m for m in module_classes[base.id].body if getattr(m, "name", None) not in own]
            _collect_body(f"{prefix}::{node.name}", members, [*marks, *node.decorator_list], names, scope,
                          hooked, funcs, classes, out, module_classes)


def _is_testcase(node: ast.ClassDef) -> bool:
    """A ``unittest.TestCase`` subclass: pytest collects it whatever its name."""
    return any((isinstance(b, ast.Name) and b.id.endswith("TestCase")) or
               (isinstance(b, ast.Attribute) and b.attr.endswith("TestCase")) for b in node.bases)


def bound_of(collected: Collected, node_id: str) -> tuple[str, int | None] | None:
    """(the collected function a reported node id names, its count), or None if it names none.
    ``node_id`` is relative to ``/tests`` (a leading ``/tests/`` or ``tests/`` is dropped)."""
    file, sep, rest = node_id.split("[", 1)[0].partition("::")
    file = posixpath.normpath(file)
    while file.startswith("../"):   # a rootdir beside /tests (the task's own --rootdir)
        file = file[3:]
    base = file.removeprefix("/tests/").removeprefix("tests/") + sep + rest
    if base not in collected.functions:
        return None
    return base, collected.functions[base]

