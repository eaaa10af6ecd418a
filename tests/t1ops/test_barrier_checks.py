"""The barrier's proofs with fake engines (no processes): loaded weights and resumption.

What is checked is the pool's handling (t1ops.engines.checks): a checksum mismatch keeps
the engine out of traffic and re-syncs it, a persistent one kills it; an engine whose continue
was lost fails the probe and is declared dead before the gate opens; an engine that answers
503 to a request is dead at once. The real engines are in the chaos scenarios.
"""
from __future__ import annotations

import threading
import time

from rl.engines import protocol as P
from rl.errors import EngineError
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.slots import EngineHandle
from t1ops.engines.pool import EnginePool

GOOD = {"w1": "aa", "w2": "bb"}


class _Engine:
    def __init__(self, url: str, drop_continue: bool = False, fail_generate: bool = False) -> None:
        self.base_url, self.version = url, "0"
        self.tensors = dict(GOOD)
        self.drop_continue, self.fail_generate = drop_continue, fail_generate
        self.running = threading.Event()
        self.running.set()
        self.aborted: list[str] = []

    def health_generate(self) -> bool:
        return True

    def weight_version(self) -> str:
        return self.version

    def pause_generation(self, mode="abort") -> None:
        self.running.clear()

    def continue_generation(self) -> None:
        if not self.drop_continue:
            self.running.set()

    def abort_request(self, rid: str = "", *, abort_all: bool = False) -> None:
        self.aborted.append(rid)

    def weight_checksums(self, dtype: str) -> dict:
        return {"weight_version": self.version, "dtype": dtype, "tensors": dict(self.tensors)}

    def generate(self, request):
        if self.fail_generate:
            raise EngineError("HTTP 503: engine failed: background loop died", status_code=503)
        if not self.running.wait(timeout=5):
            return P.GenerateResponse(output_ids=(), finish_reason=P.FinishReason(type="abort", message="paused"),
                                      weight_version=self.version, prompt_tokens=1, completion_tokens=0)
        return P.GenerateResponse(output_ids=(1,), finish_reason=P.FinishReason(type="length", length=1),
                                  weight_version=self.version, prompt_tokens=1, completion_tokens=1, rid=request.rid)


class _Sync:
    """Loads GOOD into every target, except the first ``corrupt`` publishes to the engines in ``bad``."""

    admits_alone = True

    def __init__(self, bad: set[int] = frozenset(), corrupt: int = 0) -> None:
        self.bad, self.corrupt, self.published = set(bad), corrupt, []

    def publish(self, targets, source, version):
        self.published.append(sorted(i for i, _ in targets))
        for i, engine in targets:
            engine.version = version
            engine.tensors = dict(GOOD, w2="xx") if i in self.bad and len(self.published) <= self.corrupt else dict(GOOD)
        return {}

    def admit(self, client, source, version):
        client.version = version

    def expected_checksums(self, version):
        return {"dtype": "bfloat16", "tensors": dict(GOOD)}


def _pool(engines, sync, spares=(), **cfg) -> EnginePool:
    cfg = EngineConfig(num_engines=len(engines), health_interval_s=0.05, warmup_grace_s=0.0, request_timeout_s=1.0,
                       **{"resume_deadline_s": 0.4, **cfg})
    first, queue = dict(enumerate(engines)), list(spares)

    def make(slot):  # first the given engines, then the spares (replacements), else the same one again
        engine = first.pop(slot, None) or (queue.pop(0) if queue else engines[slot])
        return EngineHandle(url=engine.base_url, client=engine)
    pool = EnginePool(make, cfg, version="0", weight_sync=sync)
    pool.start()
    pool.wait_until_live(timeout_s=10)
    return pool


def test_a_mismatching_engine_is_resynced_before_traffic_then_serves():
    sync = _Sync(bad={1}, corrupt=1)
    pool = _pool([_Engine("http://e0"), _Engine("http://e1")], sync)
    try:
        report = pool.sync_weights("ckpt", "1")
        assert sync.published == [[0, 1], [1]]  # only the mismatching engine was re-synced
        assert report.live_slots == (0, 1) and report.dead_slots == ()
    finally:
        pool.close()


def test_a_persistent_mismatch_is_declared_dead_and_recreated():
    sync = _Sync(bad={1}, corrupt=99)
    replacement = _Engine("http://e1b")
    replacement.version, replacement.tensors = "default", dict(GOOD, w1="xx")  # starts elsewhere, loads corrupt
    pool = _pool([_Engine("http://e0"), _Engine("http://e1")], sync, spares=[replacement], weight_resyncs=1)
    since = time.time()
    try:
        report = pool.sync_weights("ckpt", "1")
        assert report.recreated_slots == (1,) and sync.published == [[0, 1], [1]]
        dead = [e for e in telemetry.recent_events("engine.dead", since=since) if e.get("slot") == 1]
        assert dead and "differ from the trainer's in 1 tensor(s) (first: ['w2'])" in dead[-1]["reason"]
        # the replacement loads alone at admission (disk sync) and is checked there too
        deadline = time.monotonic() + 10
        while "admission" not in pool.slot_state(1)[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.slot_state(1)[0] == "dead" and "admission: loaded weights" in pool.slot_state(1)[1]
    finally:
        pool.close()


def test_with_verification_off_the_corrupted_engine_serves():
    sync = _Sync(bad={1}, corrupt=99)
    pool = _pool([_Engine("http://e0"), _Engine("http://e1")], sync, verify_weights=False)
    try:
        assert pool.sync_weights("ckpt", "1").live_slots == (0, 1) and sync.published == [[0, 1]]
    finally:
        pool.close()


def test_an_engine_left_paused_fails_the_probe_and_is_recreated():
    engines = [_Engine("http://e0"), _Engine("http://e1", drop_continue=True)]
    pool = _pool(engines, _Sync())
    try:
        report = pool.sync_weights("ckpt", "1")
        assert report.recreated_slots == (1,)
        assert len(engines[1].aborted) == 2  # both probes were aborted, none left queued
    finally:
        pool.close()


def test_without_the_probe_a_paused_engine_stays_in_rotation():
    engines = [_Engine("http://e0", drop_continue=True)]
    pool = _pool(engines, _Sync(), resume_probe=False)
    try:
        assert pool.sync_weights("ckpt", "1").live_slots == (0,) and not engines[0].running.is_set()
    finally:
        pool.close()


def test_an_engine_answering_503_is_dead_at_once_and_the_request_resubmitted():
    engines = [_Engine("http://e0", fail_generate=True), _Engine("http://e1")]
    pool = _pool(engines, _Sync())
    try:
        pool._slots[1].last_used = 10**9  # the failed engine is picked first
        resp = pool.generate(P.GenerateRequest(input_ids=(1,), sampling_params=P.SamplingParams(max_new_tokens=1)))
        assert resp.output_ids == (1,)
        status, reason, _ = pool.slot_state(0)
        assert status == "dead" and "reported itself failed" in reason
    finally:
        pool.close()
