"""Imports go one way: chaos -> t1ops -> rl (docs/style.md rule 1)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def _violations(package: str, forbidden: set[str]) -> list[str]:
    bad = []
    for f in sorted((REPO / package).rglob("*.py")):
        hit = _imported_roots(f) & forbidden
        if hit:
            bad.append(f"{f.relative_to(REPO)} imports {sorted(hit)}")
    return bad


def test_rl_imports_neither_t1ops_nor_chaos():
    assert _violations("rl", {"t1ops", "chaos"}) == []


def test_t1ops_does_not_import_chaos():
    assert _violations("t1ops", {"chaos"}) == []


def test_checker_sees_a_violation(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from t1ops.config import load_toml\n")
    assert _imported_roots(f) == {"t1ops"}
