"""Seeded randomised fault schedules: same seed, same schedule; a short campaign survives one."""
from __future__ import annotations

from pathlib import Path

import pytest

from chaos.schedule import FAULTS, make_schedule, run_schedule
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parents[2]


def test_schedule_replays_from_its_seed():
    a = make_schedule(7, 5, 4, num_engines=2, num_workers=1)
    assert a == make_schedule(7, 5, 4, num_engines=2, num_workers=1)
    assert a != make_schedule(8, 5, 4, num_engines=2, num_workers=1)
    assert len(a) == 5 and {f.kind for f in a} == set(FAULTS)
    assert all(1 <= f.step <= 4 for f in a)


@pytest.mark.chaos
@pytest.mark.slow
def test_seeded_schedule_of_five_faults_against_a_campaign(tmp_path):
    cfg = load_toml(REPO / "examples" / "tiny" / "campaign.toml")
    cfg.rollout.tasks_dir = str(REPO / "examples" / "tasks")
    seed = 20261129
    res = run_schedule(seed, 5, cfg, str(tmp_path), num_steps=4)
    assert len(res["fired"]) == 5, f"seed {seed}: only {len(res['fired'])} faults fired"
    assert res["passed"], f"seed {seed} (replay: t1ops chaos schedule --seed {seed}): {res['invariants']}"
    assert [tuple(f.values()) for f in res["schedule"]] == \
        [(f.step, f.kind, f.target) for f in make_schedule(seed, 5, 4, 2, cfg.rollout.num_workers)]
