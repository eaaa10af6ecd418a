"""The runbook index: ``runbooks/README.md``, one line per runbook, generated from the files.

A runbook is ``runbooks/<id>.md`` (``id`` = the catalogue id = the chaos
scenario id). Its first line is ``# <id>: <one-line symptom>``; a runbook
whose heading has no subtitle is listed with its scenario's registered title.
Regenerate with ``t1ops chaos index --write``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from chaos.harness import RUNBOOK_DIR

INDEX_NAME = "README.md"

_HEADER = """\
# Runbooks

One runbook per failure of the catalogue (`docs/failures.md`), written for the
person paged at 3 a.m. Each has the same sections: Symptom, Wrong first hypothesis, Mechanism,
How t1ops detects it, What to do, Reproduce. Every one is reproduced by its chaos scenario,
`t1ops chaos run <id>` (module `chaos/scenarios/<id_with_underscores>.py`); `t1ops chaos run --all`
runs them all.

This index is generated from the files: `t1ops chaos index --write`.

| id | symptom | reproduce |
|---|---|---|
"""


def runbook_ids(runbook_dir: Path = RUNBOOK_DIR) -> list[str]:
    """Ids of the runbooks in ``runbook_dir`` (every ``*.md`` but the index), sorted."""
    return sorted(p.stem for p in Path(runbook_dir).glob("*.md") if p.name != INDEX_NAME)


def runbook_subtitle(text: str, runbook_id: str) -> str:
    """The ``<symptom>`` of a first line ``# <id>: <symptom>``; "" when the heading has none."""
    first = text.lstrip().split("\n", 1)[0]
    prefix = f"# {runbook_id}:"
    return first[len(prefix):].strip() if first.startswith(prefix) else ""


def index_markdown(runbook_dir: Path = RUNBOOK_DIR, titles: Mapping[str, str] | None = None) -> str:
    """The index page: one table row per runbook (id linked to its file, symptom, command).

    ``titles`` (scenario id -> registered title) fills in for runbooks whose
    heading carries no subtitle.
    """
    titles = titles or {}
    rows = []
    for rid in runbook_ids(runbook_dir):
        symptom = runbook_subtitle((Path(runbook_dir) / f"{rid}.md").read_text(), rid) or titles.get(rid, "")
        symptom = symptom.replace("|", "\\|")
        rows.append(f"| [{rid}]({rid}.md) | {symptom} | `t1ops chaos run {rid}` |")
    return _HEADER + "\n".join(rows) + "\n"
