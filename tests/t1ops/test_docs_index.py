"""docs/README.md lists every page of docs/ (issue 55: it omitted five of them)."""
from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_docs_index_lists_every_page():
    listed = set(re.findall(r"\]\(([a-z0-9_-]+\.md)\)", (DOCS / "README.md").read_text()))
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert pages - listed == set(), f"pages missing from docs/README.md: {sorted(pages - listed)}"
    assert listed - pages == set(), f"docs/README.md links pages that do not exist: {sorted(listed - pages)}"
