"""The combination matrix (chaos/matrix.py): the pairwise cover, and its cells as campaigns."""
from __future__ import annotations

import pytest

from chaos.matrix import STANDS_IN, Cell, covers_all_pairs, full_matrix, pairwise, run_cell


def test_pairwise_cover_has_every_pair_of_values_and_the_check_can_fail():
    assert len(full_matrix()) == 18 and covers_all_pairs(full_matrix())
    cells = pairwise()
    assert len(cells) == 9 and covers_all_pairs(cells)
    assert not covers_all_pairs([c for c in cells if c.mode != "sync"])  # a missing pair is seen
    assert not covers_all_pairs([Cell(c.mode, c.trainer, "disk") for c in cells])


def _run_here() -> list[Cell]:
    return [c for c in pairwise() if (c.mode, c.trainer, c.sync) not in STANDS_IN]


def test_a_scenario_that_stands_in_for_a_cell_runs_that_cell_killed_and_resumed_with_eval():
    """coordinator-crash is the pairwise cell fully_async x dp=2 x distributed: its own overrides
    make that combination, with held-out eval on, and it SIGKILLs and resumes the run."""
    from chaos.scenarios import coordinator_crash
    from t1ops.config import load_toml
    from t1ops.overrides import parse_assignments

    assert covers_all_pairs(_run_here() + [Cell(*key) for key in STANDS_IN])
    assert len(_run_here()) == len(pairwise()) - len(STANDS_IN)
    (key, scenario), = STANDS_IN.items()
    assert scenario == "coordinator-crash" and Cell(*key) in pairwise()
    cfg = load_toml(coordinator_crash.RECIPE, overrides=parse_assignments(coordinator_crash.OVERRIDES))
    p = cfg.trainer.parallel
    trainer = "1 rank" if p.world_size == 1 else "dp=2" if (p.dp, p.tp, p.ep) == (2, 1, 1) else "other"
    assert (cfg.run.mode, trainer, cfg.engine.weight_sync) == key
    assert cfg.eval.every_steps > 0 and coordinator_crash.KILL_AT_STEP <= coordinator_crash.STEPS


@pytest.mark.slow
@pytest.mark.parametrize("cell", _run_here(), ids=lambda c: f"{c.mode}-{c.trainer}-{c.sync}".replace(" ", ""))
def test_cell_runs_with_eval_and_resumes_after_a_kill(cell, tmp_path):
    result = run_cell(cell, tmp_path)
    assert result.ok, result.detail


def test_the_table_replaces_only_the_results_section(tmp_path):
    from chaos.matrix import write_results

    doc = tmp_path / "matrix.md"
    doc.write_text("# The combination matrix\n\nprose\n\n## Results\n\nold table\n\n## Notes\n\nkept\n")
    write_results(doc, "| mode | ok |\n")
    assert doc.read_text() == "# The combination matrix\n\nprose\n\n## Results\n\n| mode | ok |\n\n## Notes\n\nkept\n"
