"""DirectEngines: a worker's requests go straight to real engines, guarded as EnginePool guards them.

The pool (real embedded engine processes) keeps pings, process ownership and the
barrier; DirectEngines reads its view and calls the engines itself. SIGKILL one
engine mid-rollout: nothing is lost; a weight sync mid-rollout: aborted requests
come back under the new version; a wrong-version answer takes the engine out.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rl.engines.client import EngineClient
from t1ops import telemetry
from t1ops.engines.direct import DirectEngines
from t1ops.engines.slots import spawn_factory
from t1ops.engines.pool import EnginePool
from t1ops.guards.http import BoundedHttp

from tests.t1ops.test_engine_pool import _cfg, _req, _wait_for, checkpoint, spec  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


@pytest.fixture
def pool_and_direct(spec, tmp_path):
    from rl.engines.embedded_spawn import spawn

    cfg = _cfg()
    http = BoundedHttp.from_config(cfg)
    kw = dict(num_moe_layers=spec.num_layers, topk=spec.moe_router_topk, num_experts=spec.num_experts)
    factory = spawn_factory(lambda port: spawn(port, spec, log_path=tmp_path / f"engine-{port}.log"), http, **kw)
    pool = EnginePool(factory, cfg)
    pool.start()
    pool.wait_until_live(timeout_s=120)
    direct = DirectEngines(pool.view, pool.report_failure, cfg, refresh_s=0.1,
                           make_client=lambda url: EngineClient(url, BoundedHttp.from_config(cfg), **kw))
    yield pool, direct
    direct.close()
    pool.close()


def test_sigkill_and_a_weight_sync_mid_rollout_lose_nothing(pool_and_direct, checkpoint):
    pool, direct = pool_and_direct
    assert direct.generate(_req("first")).weight_version == "default"
    results, errors = [], []

    def work(i: int) -> None:
        try:
            results.append(direct.generate(_req(f"r{i}", n=24)))
        except Exception as e:  # recorded: asserted empty below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    _wait_for(lambda: len(direct._tickets) == 6)
    os.kill(pool.slot(0).process.pid, signal.SIGKILL)
    for th in threads:
        th.join(timeout=120)
    assert not errors and len(results) == 6 and all(len(r.output_ids) == 24 for r in results)
    assert pool.live_slots() == [1] and pool.num_in_flight() == 0  # the pool never saw the requests

    results.clear()
    long = [threading.Thread(target=lambda i=i: results.append(direct.generate(_req(f"l{i}", n=120))))
            for i in range(4)]
    for th in long:
        th.start()
    _wait_for(lambda: len(direct._tickets) == 4)
    report = pool.sync_weights(checkpoint, "1")  # mid-generation: the engine aborts them, they come back
    for th in long:
        th.join(timeout=120)
    assert len(results) == 4 and all(len(r.output_ids) == 120 and not r.spans_versions for r in results)
    assert report.num_aborted_in_flight == 0       # the pool saw none of them ...
    assert all(r.weight_version == "1" for r in results)  # ... yet each was resubmitted under the new version
    assert report.recreated_slots == (0,)


def test_an_answer_under_an_unpublished_version_takes_the_engine_out(pool_and_direct):
    pool, direct = pool_and_direct
    rogue = pool.slot(0)
    rogue.client.update_weight_version("rogue", abort_all_requests=False)
    seen = [direct.generate(_req(f"v{i}")) for i in range(4)]  # least loaded: both engines get requests
    assert all(r.weight_version == "default" for r in seen)
    assert pool.slot_state(0)[0] == "dead" and "missed a weight sync" in pool.slot_state(0)[1]
    assert any(e["name"] == "engine.dead" for e in telemetry.recent_events())

