"""EnginePool against real engine processes: pings, grace, SIGKILL, resubmission, the barrier."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rl.engines import protocol as P
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.errors import EngineDeadError, InputError
from t1ops.guards.engines import EnginePool, spawn_factory
from t1ops.guards.http import BoundedHttp

STANDIN = Path(__file__).with_name("engine_standin.py")
L, K = 2, 2


def spawn_standin(port: int, token_delay_s: float = 0.02) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(STANDIN), str(port), "--token-delay-s", str(token_delay_s)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _cfg(**kw) -> EngineConfig:
    base = dict(num_engines=2, health_interval_s=0.2, failure_threshold=2, warmup_grace_s=30.0,
                request_timeout_s=0.5, request_attempts=2, retry_backoff_s=0.01, generate_timeout_s=20.0,
                max_resubmits=2)
    base.update(kw)
    return EngineConfig(**base)


@pytest.fixture
def make_pool():
    pools = []

    def make(cfg: EngineConfig, *, pinger: bool = True, spawn=spawn_standin, wait: bool = True,
             clock=None) -> EnginePool:
        http = BoundedHttp.from_config(cfg)
        pool = EnginePool(spawn_factory(spawn, http, num_moe_layers=L, topk=K), cfg,
                          **({"clock": clock} if clock else {}))
        pools.append(pool)
        pool.start(pinger=pinger)
        if wait:
            pool.wait_until_live(timeout_s=30)
        return pool
    yield make
    for p in pools:
        p.close()


def _req(rid: str, n: int = 4) -> P.GenerateRequest:
    return P.GenerateRequest(input_ids=(1, 2, 3), sampling_params=P.SamplingParams(max_new_tokens=n),
                             return_routed_experts=True, rid=rid)


def test_generate_then_barrier_publishes_and_rotates_inside(make_pool, tmp_path):
    pool = make_pool(_cfg())
    first = pool.generate(_req("a"))
    assert first.weight_version == "0" and first.routed_experts_RLK.shape == (3 + 4 - 1, L, K)
    seen = {}

    def rotate(version: str) -> None:  # must run with the gate closed and nothing in flight
        seen.update(version=version, gate_open=pool._gate_open,
                    in_flight=sum(len(s.in_flight) for s in pool._slots),
                    engine_versions=[pool.slot(i).client.weight_version() for i in pool.live_slots()])
    report = pool.sync_weights(str(tmp_path), "1", rotate)
    assert seen == {"version": "1", "gate_open": False, "in_flight": 0, "engine_versions": ["1", "1"]}
    assert report.live_slots == (0, 1) and report.recreated_slots == ()
    assert pool.generate(_req("b")).weight_version == "1"
    with pytest.raises(InputError, match="must be new"):
        pool.sync_weights(str(tmp_path), "1")


def test_barrier_aborts_in_flight_and_resubmits_under_the_new_version(make_pool, tmp_path):
    pool = make_pool(_cfg(num_engines=1))
    results = []
    t = threading.Thread(target=lambda: results.append(pool.generate(_req("long", n=40))))
    t.start()
    while not any(s.in_flight for s in pool._slots):
        threading.Event().wait(0.01)
    threading.Event().wait(0.1)  # the request is generating
    report = pool.sync_weights(str(tmp_path), "1")
    t.join(timeout=20)
    assert report.num_aborted_in_flight == 1
    assert len(results) == 1 and results[0].weight_version == "1" and len(results[0].output_ids) == 40
    assert not results[0].spans_versions


def test_sigkill_mid_rollout_loses_nothing_and_recreates_at_sync(make_pool, tmp_path):
    pool = make_pool(_cfg())
    victim = pool.slot(0).process
    results, errors = [], []

    def work(i):
        try:
            results.append(pool.generate(_req(f"r{i}", n=25)))
        except Exception as e:  # recorded: the test asserts there are none
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    while not pool._slots[0].in_flight:
        threading.Event().wait(0.01)
    os.kill(victim.pid, signal.SIGKILL)
    for th in threads:
        th.join(timeout=30)
    assert not errors and len(results) == 6
    assert pool.live_slots() == [1]
    dead = [e for e in telemetry.recent_events("engine.dead") if e["url"] == pool.slot(0).url]
    assert dead and "signal 9" in dead[-1]["reason"]
    report = pool.sync_weights(str(tmp_path), "1")
    assert report.recreated_slots == (0,) and pool.slot(0).process.pid != victim.pid
    pool.wait_until_live(timeout_s=30)
    assert pool.slot(0).client.weight_version() == "1"  # the replacement loaded the new checkpoint


class FakeClock:
    """Monotonic seconds the test moves by hand: the grace window is a clock reading, not a sleep."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_warmup_grace_keeps_a_frozen_engine_then_expires(make_pool):
    clock = FakeClock()
    pool = make_pool(_cfg(num_engines=1, warmup_grace_s=60.0, request_attempts=1, request_timeout_s=0.3),
                     pinger=False, wait=False, clock=clock)
    proc = pool.slot(0).process
    os.kill(proc.pid, signal.SIGSTOP)  # frozen as in a first compile
    try:
        for _ in range(3):
            pool.ping_round()
        assert pool._slots[0].status == "starting"
        assert telemetry.recent_events("engine.ping_missed_in_grace")[-1]["grace_s"] == 60.0
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    for _ in range(100):  # the process needs a moment to start serving once continued
        pool.ping_round()
        if pool.live_slots():
            break
        threading.Event().wait(0.05)
    assert pool.live_slots() == [0]
    clock.now += 61  # grace over: misses now count
    os.kill(proc.pid, signal.SIGSTOP)
    pool.ping_round()
    assert pool._slots[0].consecutive_failures == 1 and pool._slots[0].status == "live"
    pool.ping_round()
    assert pool._slots[0].status == "dead" and "2 consecutive failed health pings" in pool._slots[0].dead_reason
    assert proc.wait(timeout=10) == -signal.SIGKILL  # the pool killed the hung process


def test_request_fails_loudly_when_resubmits_run_out(make_pool):
    pool = make_pool(_cfg(num_engines=1, max_resubmits=0))
    proc = pool.slot(0).process
    out = []
    t = threading.Thread(target=lambda: out.append(_catch(lambda: pool.generate(_req("x", n=200)))))
    t.start()
    while not pool._slots[0].in_flight:
        threading.Event().wait(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    t.join(timeout=20)
    assert isinstance(out[0], EngineDeadError) and "max_resubmits 0" in str(out[0])


def test_engine_that_missed_a_sync_is_taken_out(make_pool):
    pool = make_pool(_cfg())
    pool.slot(1).client.update_weights_from_disk("/elsewhere", "9")  # behind the pool's back
    for i in range(4):
        assert pool.generate(_req(f"v{i}")).weight_version == "0"
    assert pool.live_slots() == [0]
    assert "missed a weight sync" in pool._slots[1].dead_reason


def _catch(fn):
    try:
        return fn()
    except Exception as e:  # returned for the assertion
        return e
