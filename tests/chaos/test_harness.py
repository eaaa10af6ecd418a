"""The harness itself: result shape, crash capture, runbook pairing."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaos import harness
from chaos.harness import Guarded, Outcome, register, run_scenario

REPO = Path(__file__).resolve().parents[2]


@register("_selftest-crash", "a scenario that crashes (harness self-test)")
def _crash(tmp: Path) -> Outcome:
    raise RuntimeError("boom")


@register("_selftest-miss", "a scenario whose guard misses (harness self-test)")
def _miss(tmp: Path) -> Outcome:
    (tmp / "fault").write_text("x")
    return Outcome(fault_fired=(tmp / "fault").exists(), unguarded="silent", guarded=Guarded(caught=False))


def _real_ids():
    return list(harness.discover())


def test_crash_is_a_failed_result_not_an_exception():
    res = run_scenario("_selftest-crash")
    assert not res.passed and "boom" in res.crashed


def test_uncaught_fault_fails():
    res = run_scenario("_selftest-miss")
    assert res.fault_fired and not res.passed
    d = res.to_dict()
    assert set(d) >= {"id", "fault_fired", "unguarded", "guarded", "passed", "runbook"}


@register("_selftest-no-bug-side", "a scenario that never asserts its unguarded failure (harness self-test)")
def _no_bug_side(tmp: Path) -> Outcome:
    return Outcome(fault_fired=True, unguarded="printed only", guarded=Guarded(caught=True),
                   invariants={"nothing_lost": True})


def test_a_scenario_must_assert_its_unguarded_failure():
    res = run_scenario("_selftest-no-bug-side")
    assert res.fault_fired and res.guarded.caught and not res.passed and not res.unguarded_asserted


def test_unknown_id_lists_known():
    with pytest.raises(KeyError, match="known"):
        run_scenario("no-such-failure")


def test_every_scenario_has_a_runbook_naming_it():
    for sid in _real_ids():
        rb = REPO / "runbooks" / f"{sid}.md"
        assert rb.exists(), f"scenario {sid} has no runbook {rb}"
        assert f"t1ops chaos run {sid}" in rb.read_text(), f"{rb} does not name its scenario command"


def test_every_runbook_has_a_scenario():
    ids = set(_real_ids())
    for rb in (REPO / "runbooks").glob("*.md"):
        if rb.stem in ("README", "index"):
            continue
        assert rb.stem in ids, f"runbook {rb.name} has no registered scenario"


def _catalogue_ids() -> list[str]:
    text = (REPO / "docs" / "failures.md").read_text()
    return re.findall(r"^\| ([a-z0-9-]+) \|", text, flags=re.M)


def test_catalogue_ids_parse():
    ids = _catalogue_ids()
    assert "dead-engine" in ids and "hostile-archive" in ids and len(ids) >= 20
