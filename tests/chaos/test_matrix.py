"""The combination matrix (chaos/matrix.py): the pairwise cover, and its cells as campaigns."""
from __future__ import annotations

import pytest

from chaos.matrix import Cell, covers_all_pairs, full_matrix, pairwise, run_cell


def test_pairwise_cover_has_every_pair_of_values_and_the_check_can_fail():
    assert len(full_matrix()) == 18 and covers_all_pairs(full_matrix())
    cells = pairwise()
    assert len(cells) == 9 and covers_all_pairs(cells)
    assert not covers_all_pairs([c for c in cells if c.mode != "sync"])  # a missing pair is seen
    assert not covers_all_pairs([Cell(c.mode, c.trainer, "disk") for c in cells])


@pytest.mark.slow
@pytest.mark.parametrize("cell", pairwise(), ids=lambda c: f"{c.mode}-{c.trainer}-{c.sync}".replace(" ", ""))
def test_cell_runs_with_eval_and_resumes_after_a_kill(cell, tmp_path):
    result = run_cell(cell, tmp_path)
    assert result.ok, result.detail


def test_the_table_replaces_only_the_results_section(tmp_path):
    from chaos.matrix import write_results

    doc = tmp_path / "matrix.md"
    doc.write_text("# The combination matrix\n\nprose\n\n## Results\n\nold table\n\n## Notes\n\nkept\n")
    write_results(doc, "| mode | ok |\n")
    assert doc.read_text() == "# The combination matrix\n\nprose\n\n## Results\n\n| mode | ok |\n\n## Notes\n\nkept\n"
