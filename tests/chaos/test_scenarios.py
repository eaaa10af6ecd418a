"""Every registered chaos scenario runs, its fault fires, and the guardrail catches it."""
from __future__ import annotations

import pytest

from chaos import harness

SCENARIOS = sorted(harness.discover())


@pytest.mark.chaos
@pytest.mark.parametrize("scenario_id", SCENARIOS)
def test_scenario_passes(scenario_id):
    res = harness.run_scenario(scenario_id)
    assert res.crashed is None, res.crashed
    assert res.fault_fired, f"{scenario_id}: the fault did not fire: {res.details}"
    assert res.guarded.caught, f"{scenario_id}: guardrail missed it: {res.guarded.error}"
    failed = [k for k, ok in res.invariants.items() if not ok]
    assert failed == [], f"{scenario_id}: invariants broken: {failed}"
    assert res.unguarded, f"{scenario_id}: no unguarded failure signature recorded"
