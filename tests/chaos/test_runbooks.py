"""Runbooks: the six sections, the scenario command, the index, and catalogue coverage."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaos import harness
from chaos.runbooks import index_markdown, runbook_ids, runbook_subtitle

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = REPO / "runbooks"
SECTIONS = ("## Symptom", "## Wrong first hypothesis", "## Mechanism", "## How t1ops detects it",
            "## What to do", "## Reproduce")
RUNBOOK_FILES = sorted(p for p in RUNBOOKS.glob("*.md") if p.name != "README.md")


def test_there_are_runbooks():
    assert len(RUNBOOK_FILES) >= 20, [p.name for p in RUNBOOK_FILES]


@pytest.mark.parametrize("path", RUNBOOK_FILES, ids=lambda p: p.stem)
def test_runbook_has_every_section_once(path):
    headings = re.findall(r"^## .*$", path.read_text(), flags=re.M)
    missing = [s for s in SECTIONS if s not in headings]
    assert missing == [], f"{path.name} lacks {missing}; it has {headings}"
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS), f"{path.name}: sections out of order"


@pytest.mark.parametrize("path", RUNBOOK_FILES, ids=lambda p: p.stem)
def test_runbook_names_its_scenario_command(path):
    command = f"t1ops chaos run {path.stem}"
    assert command in path.read_text(), f"{path.name} does not name `{command}`"


def test_index_links_every_runbook():
    index = (RUNBOOKS / "README.md").read_text()
    linked = set(re.findall(r"\]\(([a-z0-9-]+)\.md\)", index))
    missing = sorted({p.stem for p in RUNBOOK_FILES} - linked)
    assert missing == [], f"runbooks/README.md does not link {missing}; regenerate: t1ops chaos index --write"
    dangling = sorted(linked - {p.stem for p in RUNBOOK_FILES})
    assert dangling == [], f"runbooks/README.md links missing files {dangling}"


def test_index_generator_lists_each_runbook_once_with_its_symptom(tmp_path):
    (tmp_path / "a-fault.md").write_text("# a-fault: the thing | breaks\n\n## Symptom\n")
    (tmp_path / "b-fault.md").write_text("# b-fault\n\n## Symptom\n")
    (tmp_path / "README.md").write_text("old index")
    assert runbook_ids(tmp_path) == ["a-fault", "b-fault"]
    text = index_markdown(tmp_path, {"b-fault": "from the scenario title"})
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    assert rows == ["| [a-fault](a-fault.md) | the thing \\| breaks | `t1ops chaos run a-fault` |",
                    "| [b-fault](b-fault.md) | from the scenario title | `t1ops chaos run b-fault` |"]
    assert runbook_subtitle("# routing-drift: x", "routing-drift") == "x"
    assert runbook_subtitle("# routing-drift-2: x", "routing-drift") == ""


def _catalogue_ids() -> list[str]:
    body = (REPO / "docs" / "failures.md").read_text().split("|---", 1)[1]  # rows after the header
    return re.findall(r"^\| ([a-z0-9-]+) \|", body, flags=re.M)


def test_every_catalogue_failure_has_a_registered_scenario():
    ids = _catalogue_ids()
    assert len(ids) >= 20, ids
    registered = set(harness.discover())
    missing = [i for i in ids if i not in registered]
    assert missing == [], f"catalogue failures without a chaos scenario: {missing}"


def test_every_catalogue_failure_has_a_runbook():
    missing = [i for i in _catalogue_ids() if not (RUNBOOKS / f"{i}.md").exists()]
    assert missing == [], f"catalogue failures without runbooks/<id>.md: {missing}"


def test_every_catalogue_row_names_a_guard_module_that_exists():
    body = (REPO / "docs" / "failures.md").read_text().split("|---", 1)[1]
    rows = re.findall(r"^\| ([a-z0-9-]+) \|.*\| `([^`]+)` \|$", body, flags=re.M)
    assert len(rows) == len(_catalogue_ids()), "every catalogue row ends with its guard module"
    missing = [(i, m) for i, m in rows if not (REPO / m).exists()]
    assert missing == [], f"catalogue rows naming a guard module that does not exist: {missing}"


def test_every_registered_scenario_is_in_the_catalogue():
    ids = set(_catalogue_ids())
    missing = [sid for sid in harness.discover() if sid not in ids]
    assert missing == [], f"scenarios without a row in docs/failures.md: {missing}"
