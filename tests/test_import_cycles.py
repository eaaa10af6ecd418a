"""No import circle inside a package, lazy imports included; ``rl.agent`` never imports ``rl.harness``.

A circle between two modules of one package (``archive`` <-> ``ziparchive``,
``runner`` <-> ``async_loop``) means neither is below the other: a lazy import
inside a function only hides it. Chat template and tool-call parsing live in
``rl.chat``, below both the agent loop and the harness.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("rl", "t1ops", "chaos")


def _module(path: Path, root: Path = REPO) -> str:
    rel = path.relative_to(root).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imports(path: Path, known: set[str], root: Path = REPO) -> set[str]:
    """Modules of ``known`` that ``path`` imports anywhere (function bodies included)."""
    me = _module(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:  # a type annotation's import runs never
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out.update(n for n in names if n in known and n != me)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@functools.lru_cache(maxsize=1)  # parsed once for both checks
def _graph() -> dict[str, set[str]]:
    files = [f for root in ROOTS for f in (REPO / root).rglob("*.py")]
    known = {_module(f) for f in files}
    return {_module(f): _imports(f, known) for f in files}


def _package(module: str) -> str:
    return module.rpartition(".")[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Circles among sibling modules of one package (a package's ``__init__`` is not a sibling)."""
    packages = {m for m in graph if any(_package(o) == m for o in graph)}
    siblings = {m: {o for o in targets if _package(o) == _package(m) and o not in packages}
                for m, targets in graph.items() if m not in packages}
    found, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in siblings.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(siblings):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_inside_a_package():
    assert cycles(_graph()) == []


def test_agent_does_not_import_the_harness():
    graph = _graph()
    bad = sorted(f"{m} imports {sorted(t)}" for m, targets in graph.items() if m.startswith("rl.agent")
                 for t in [{x for x in targets if x.startswith("rl.harness")}] if t)
    assert bad == []


def test_the_checker_sees_a_lazy_circle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "c.py").write_text("from . import a\nif TYPE_CHECKING:\n    from pkg.b import f\n")
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c"}
    graph = {f"pkg.{n}": _imports(pkg / f"{n}.py", known, tmp_path) for n in ("a", "b", "c")}
    assert graph["pkg.b"] == {"pkg", "pkg.a"} and graph["pkg.c"] == {"pkg", "pkg.a"}  # lazy, relative, typing-only
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
