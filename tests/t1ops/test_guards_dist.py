"""Distributed timeouts: configured values, refusal without a timeout, NCCL env, slow reporting."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from t1ops import telemetry
from t1ops.config import GuardsConfig
from t1ops.errors import ConfigError, DistributedTimeoutError
from t1ops.guards import dist


def test_timeouts_follow_the_report():
    g = GuardsConfig()
    assert dist.timeout_for("nccl", g) == timedelta(minutes=30)
    assert dist.timeout_for("nccl", g, context_parallel=2) == timedelta(minutes=120)
    assert dist.timeout_for("gloo", g, context_parallel=4) == timedelta(minutes=60)
    assert dist.timeout_for("gloo", GuardsConfig(gloo_timeout_min=5)) == timedelta(minutes=5)
    with pytest.raises(ConfigError, match="backend='mpi'"):
        dist.timeout_for("mpi", g)


@pytest.mark.parametrize("fn", [dist.init_process_group, dist.new_group])
def test_group_creation_refuses_a_missing_or_bad_timeout(fn):
    args = ("gloo",) if fn is dist.init_process_group else ()
    with pytest.raises(DistributedTimeoutError, match="explicit timeout"):
        fn(*args, timeout=None)
    with pytest.raises(DistributedTimeoutError, match="positive datetime.timedelta"):
        fn(*args, timeout=1800)
    with pytest.raises(DistributedTimeoutError, match="positive"):
        fn(*args, timeout=timedelta(0))


_REAL_GLOO_GROUP = """
from datetime import timedelta
import torch, torch.distributed as tdist
from torch.distributed.distributed_c10d import _get_default_group
from t1ops import telemetry
from t1ops.guards import dist
dist.init_process_group("gloo", timeout=timedelta(seconds=42), store=tdist.HashStore(), rank=0, world_size=1)
try:
    backend = _get_default_group()._get_backend(torch.device("cpu"))
    assert backend.options._timeout == timedelta(seconds=42), backend.options._timeout
    assert dist.new_group([0], timeout=timedelta(seconds=7), backend="gloo") is not None
    assert telemetry.recent_events("dist.group_created")[-1]["timeout_s"] == 7.0
finally:
    tdist.destroy_process_group()
print("ok")
"""


def test_init_process_group_passes_the_timeout_to_a_real_gloo_group():
    # A fresh process: the default group is per process, and other tests (the model layer) create one.
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _REAL_GLOO_GROUP], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]


def test_nccl_env_is_applied_and_conflicts_refused():
    g = GuardsConfig(nccl_heartbeat_timeout_s=900)
    env: dict[str, str] = {}
    dist.apply_nccl_env(g, env)
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "900" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    dist.apply_nccl_env(g, env)  # same values again: consistent, fine
    env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] = "480"
    with pytest.raises(ConfigError, match="TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=480 \\(config wants 900\\)"):
        dist.apply_nccl_env(g, env)


def test_watch_collective_reports_slow_before_timeout_without_sleeping():
    released = threading.Event()
    t = [0.0]
    w = dist.watch_collective("weight-update barrier", timedelta(seconds=0.2), slow_fraction=0.25, clock=lambda: t[0])
    since = time.time()
    with w:
        t[0] = 0.06
        # the slow event is emitted by a timer thread after 0.05 s of real time
        for _ in range(200):
            if w.slow_at_s is not None:
                break
            released.wait(0.01)
        t[0] = 0.1
    assert w.slow_at_s == pytest.approx(0.06) and w.elapsed_s == pytest.approx(0.1)
    ev = telemetry.recent_events("dist.collective_slow", since=since)
    assert len(ev) == 1 and "slow, not dead" in ev[-1]["message"]


def test_watch_collective_quiet_when_fast_and_records_failure():
    w = dist.watch_collective("fast", timedelta(seconds=60))
    with w:
        pass
    assert w.slow_at_s is None
    with pytest.raises(RuntimeError):
        with dist.watch_collective("broken", timedelta(seconds=60)):
            raise RuntimeError("Timed out waiting 1000ms")
    assert telemetry.recent_events("dist.collective_failed")[-1]["collective"] == "broken"


def test_doctor_shows_effective_timeouts(monkeypatch):
    c = dist.dist_group_timeouts()
    assert "nccl=0:30:00 (CP>1: 2:00:00), gloo control=1:00:00" in c.detail
    monkeypatch.setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "1")
    c = dist.dist_group_timeouts()
    assert c.status == "warn" and "CONFLICT" in c.detail
