"""An engine pool whose every engine died is recreated at once, not at the next weight sync.

The next sync waits for the rollout in flight, which waits for a live engine: with the whole
fleet dead, "recreate at the next sync" would stall the run until the stall guard fires (seen
in the seeded five-fault schedule, tests/chaos/test_schedule.py). Engines here are healthy
fakes over httpx's MockTransport: the pool logic needs no process.
"""
from __future__ import annotations

import time

import httpx

from rl.engines import protocol as P
from rl.engines.client import EngineClient
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.pool import EnginePool
from t1ops.engines.slots import EngineHandle
from t1ops.guards.http import BoundedHttp


def _healthy_engine(url: str) -> EngineHandle:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == P.MODEL_INFO:
            return httpx.Response(200, json={"weight_version": "default"})
        return httpx.Response(200)
    http = BoundedHttp(timeout_s=1, attempts=1, generate_timeout_s=1,
                       client=httpx.Client(transport=httpx.MockTransport(handler)))
    return EngineHandle(url=url, client=EngineClient(url, http))


def _pool(made: list[int]) -> EnginePool:
    def factory(slot: int) -> EngineHandle:
        made.append(slot)
        return _healthy_engine(f"http://e{slot}-{len(made)}")
    cfg = EngineConfig(num_engines=2, health_interval_s=0.02, failure_threshold=2, warmup_grace_s=30.0)
    pool = EnginePool(factory, cfg)
    pool.start()
    pool.wait_until_live(timeout_s=30)
    return pool


def _until(pred, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_fleet_with_every_engine_dead_is_recreated_without_waiting_for_a_sync():
    made: list[int] = []
    pool = _pool(made)
    try:
        assert sorted(made) == [0, 1]
        pool.table.declare_dead(pool.table.slots[0], "killed (test)")
        time.sleep(0.2)  # ten ping rounds: one live engine left, so recreation waits for the sync
        assert sorted(made) == [0, 1] and pool.live_slots() == [1]
        pool.table.declare_dead(pool.table.slots[1], "stalled (test)")
        assert _until(lambda: pool.live_slots() == [0, 1]), pool.describe()
        assert sorted(made) == [0, 0, 1, 1]
        assert [e for e in telemetry.recent_events() if e["name"] == "engine.none_left"]
    finally:
        pool.close()
