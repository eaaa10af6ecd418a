"""RankWatch: beacons per micro-batch feed the watchdog; a hang dumps EVERY rank's stacks."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t1ops.config import GuardsConfig
from t1ops.errors import HangError
from t1ops.guards.rank_watch import ProgressBeacon, RankProcess, RankWatch, read_progress

REPO = Path(__file__).resolve().parents[2]
# A rank: beacons along a decaying (warm-up) curve, then rank 1 stops in _stuck_in_collective.
RANK = """
import sys, threading, time
from t1ops.guards.rank_watch import ProgressBeacon
from t1ops.guards.watchdog import install_stack_dump
rank, out = int(sys.argv[1]), sys.argv[2]
f = install_stack_dump(f"{out}/rank{rank}.stacks")
beacon = ProgressBeacon(f"{out}/rank{rank}.progress")
for i, pause in enumerate([0.8, 0.4, 0.2, 0.1, 0.1, 0.1]):
    time.sleep(pause)
    beacon(i + 1)
def _stuck_in_collective():
    threading.Event().wait()
_stuck_in_collective()
"""


def test_progress_beacon_round_trip(tmp_path):
    beacon = ProgressBeacon(tmp_path / "r.progress")
    assert read_progress(tmp_path / "r.progress") == 0
    beacon(7)
    assert read_progress(tmp_path / "r.progress") == 7
    assert read_progress(tmp_path / "missing") is None


def test_warm_up_is_not_a_hang_and_a_hang_dumps_every_rank(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(tmp_path)], cwd=REPO, env=env)
             for r in range(2)]
    try:
        while any(read_progress(tmp_path / f"rank{r}.progress") is None for r in range(2)):
            time.sleep(0.01)
        guards = GuardsConfig(watchdog_min_bound_s=1.0, watchdog_first_step_bound_s=30.0)
        watch = RankWatch(guards, {r: RankProcess(p.pid, tmp_path / f"rank{r}.progress", tmp_path / f"rank{r}.stacks")
                                   for r, p in enumerate(procs)}, wait_s=10)
        watch.expect_work()
        seen, deadline = set(), time.monotonic() + 90
        with pytest.raises(HangError) as err:
            while time.monotonic() < deadline:
                seen.update(s.status for s in watch.poll().values())
                time.sleep(0.02)
        assert "warming_up" in seen  # the decaying curve was never called hung
        text = str(err.value)
        assert "--- rank 0 (pid" in text and "--- rank 1 (pid" in text  # every rank's stacks
        assert text.count("_stuck_in_collective") >= 2
    finally:
        for p in procs:
            p.kill()
            p.wait()
