"""The combination matrix (chaos/matrix.py): the pairwise cover, and its cells as campaigns."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.matrix import MODES, STANDS_IN, SYNCS, TRAINERS, Cell, covers_all_pairs, full_matrix, pairwise, run_cell
from t1ops.audit import audit_dump


def test_pairwise_cover_has_every_pair_of_values_and_the_check_can_fail():
    assert len(full_matrix()) == 30 and covers_all_pairs(full_matrix())
    cells = pairwise()
    assert len(cells) == 15 and covers_all_pairs(cells)
    assert not covers_all_pairs([c for c in cells if c.mode != "sync"])  # a missing pair is seen
    assert not covers_all_pairs([Cell(c.mode, c.trainer, "disk") for c in cells])


def _run_here() -> list[Cell]:
    return [c for c in pairwise() if c not in STANDS_IN]


# The default run (CI's) runs one cell of each layout, each a kill and resume: every layout, mode and
# sync appears in these cells or the stand-ins; the rest of the pairwise cover is heavy (`pytest --heavy`,
# or `python -m chaos.matrix --pairwise`; docs/testing.md "Heavy tests"). A cell costs 2-5 minutes of a
# 2-core host, and the suite ran 13 of them (docs/testing.md "Where the time goes").
DEFAULT_CELLS = (Cell("fully_async", "1 rank", "disk"), Cell("one_step", "dp=2", "disk"),
                 Cell("one_step", "tp=2+ep=2", "distributed"), Cell("sync", "pp=2", "distributed"),
                 Cell("one_step", "cp=2", "distributed"))


def _cell_params() -> list:
    # heavy, not skipped: a skip would be a check that never runs (and fails in CI)
    return [c if c in DEFAULT_CELLS else pytest.param(c, marks=pytest.mark.heavy) for c in _run_here()]


def test_the_default_run_has_a_cell_of_every_layout_mode_and_sync():
    ran = set(DEFAULT_CELLS) | set(STANDS_IN)
    assert set(DEFAULT_CELLS) <= set(_run_here())
    assert {c.trainer for c in DEFAULT_CELLS} == set(TRAINERS)  # a cell of its own for every layout
    assert {c.mode for c in ran} == set(MODES) and {c.sync for c in ran} == set(SYNCS)
    heavy = [p for p in _cell_params() if not isinstance(p, Cell)]
    assert len(heavy) == len(_run_here()) - len(DEFAULT_CELLS)


def _stand_in_config(name: str):
    """The configuration a stand-in runs, from its own module's constants."""
    from chaos import recovery
    from chaos.scenarios import coordinator_crash
    from t1ops.config import load_toml
    from t1ops.overrides import parse_assignments

    base, overrides = {"coordinator-crash": (coordinator_crash.RECIPE, coordinator_crash.OVERRIDES),
                       "verify-recovery": (recovery.CONFIG, recovery.DETERMINISTIC)}[name]
    return load_toml(base, overrides=parse_assignments(overrides))


def test_each_stand_in_runs_its_cell_with_eval_and_the_cover_stays_whole():
    """A run that stands in for a cell makes that combination with held-out eval on (both SIGKILL the
    coordinator and resume: coordinator-crash by definition, verify-recovery's combined run in
    tests/chaos/test_verify_recovery.py), and the cells run here plus the stand-ins cover every pair."""
    assert covers_all_pairs(_run_here() + list(STANDS_IN))
    assert len(_run_here()) == len(pairwise()) - len(STANDS_IN)
    for cell, name in STANDS_IN.items():
        assert cell in pairwise()
        cfg = _stand_in_config(name)
        p = cfg.trainer.parallel
        trainer = "1 rank" if p.world_size == 1 else "dp=2" if (p.dp, p.tp, p.ep) == (2, 1, 1) else "other"
        assert Cell(cfg.run.mode, trainer, cfg.engine.weight_sync) == cell, name
        assert cfg.eval.every_steps > 0, name


def _fully_async_books(run_dir: Path) -> None:
    """fully_async on one rank: every step trains its groups, each token's version lag is booked, the
    group books balance and every group handed out is trained once, across the kill."""
    summary = json.loads((run_dir / "summary.json").read_text())
    per_step = 2  # rollout.batch_size 4 / n_samples_per_prompt 2 (chaos.matrix.SMALL)
    for row in summary["steps"]:
        assert row["mode"] == "fully_async" and row["groups_trained"] == per_step and row["num_trajectories"] == 4
        assert sum(row["version_lag_tokens"].values()) == row["tokens"]
        for key in ("groups_dropped_zero_variance", "groups_in_flight", "staleness_violations", "violation_lags"):
            assert key in row
        assert len(row["async_books"]["pending"]) == row["groups_in_flight"] + row["groups_queued"]
    assert summary["async_books"]["balanced"]
    audit = summary["group_audit"]  # trained, dropped or left, none twice (docs/async.md, "Resume")
    assert audit["ok"] and audit["trained"] == 2 * per_step and not audit["trained_twice"], audit
    assert (run_dir / "report.png").stat().st_size > 1000
    report = audit_dump(run_dir / "dumps")
    assert report.samples >= 8 and report.drift_in_loss == 0


def _per_rank_telemetry(run_dir: Path) -> None:
    """dp = 2: every rank trained every step, fetched only its own shard, and left its own telemetry."""
    for s in json.loads((run_dir / "summary.json").read_text())["steps"]:
        assert sorted(r["rank"] for r in s["ranks"]) == [0, 1]
        assert all(r["micro_batches"] >= 1 for r in s["ranks"])
        # each dp rank fetched only its shard's trajectories (t1ops.campaign.dataplane.fetch_shard)
        a, b = (set(r["fetched"]) for r in sorted(s["ranks"], key=lambda r: r["dp_rank"]))
        assert a and b and a.isdisjoint(b) and a | b <= set(range(s["ranks"][0]["staged"]))
        assert all(0 < r["fetched_bytes"] for r in s["ranks"])
    for rank in (0, 1):
        text = "".join(p.read_text() for p in (run_dir / "telemetry" / f"trainer-rank{rank}").rglob("*.jsonl"))
        assert "trainer.rank_joined" in text and "trainer.rank_step" in text
        assert (run_dir / "ranks" / f"rank{rank}.progress").exists()
    assert any((run_dir / "checkpoints" / "actor").iterdir())  # rank 0 published the gathered weights


# What a cell's resumed run must also show, beyond steps [1, 2] once each and evals [0, 1, 2]: the
# fully_async books and the per-rank telemetry are read from these cells' runs rather than from
# campaigns of their own.
OUTPUT_CHECKS = {Cell("fully_async", "1 rank", "disk"): _fully_async_books,
                 Cell("one_step", "dp=2", "disk"): _per_rank_telemetry}


def test_every_output_check_reads_a_cell_the_suite_runs():
    assert set(OUTPUT_CHECKS) <= set(DEFAULT_CELLS)  # read in the default run


@pytest.mark.slow
@pytest.mark.parametrize("cell", _cell_params(), ids=lambda c: f"{c.mode}-{c.trainer}-{c.sync}".replace(" ", ""))
def test_cell_runs_with_eval_and_resumes_after_a_kill(cell, tmp_path):
    result = run_cell(cell, tmp_path)
    assert result.ok, result.detail
    check = OUTPUT_CHECKS.get(cell)
    if check is not None:
        check(result.run_dir)


def test_the_table_replaces_only_the_results_section(tmp_path):
    from chaos.matrix import write_results

    doc = tmp_path / "matrix.md"
    doc.write_text("# The combination matrix\n\nprose\n\n## Results\n\nold table\n\n## Notes\n\nkept\n")
    write_results(doc, "| mode | ok |\n")
    assert doc.read_text() == "# The combination matrix\n\nprose\n\n## Results\n\n| mode | ok |\n\n## Notes\n\nkept\n"
