"""The pool's barrier with a WeightSync that cannot admit an engine alone (distributed sync).

Fake engines (no processes): what is checked is the pool's bookkeeping: an engine at another
version waits healthy and out of rotation, joins at the next barrier, and
an engine the sync reports as failed is declared dead.
"""
from __future__ import annotations



import time

from rl.engines import protocol as P
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.slots import EngineHandle
from t1ops.engines.pool import EnginePool


class _FakeClient:
    def __init__(self, url: str, version: str) -> None:
        self.base_url, self.version = url, version
        self.calls: list[str] = []

    def health_generate(self) -> bool:
        return True

    def weight_version(self) -> str:
        return self.version

    def pause_generation(self, mode="abort") -> None:
        self.calls.append("pause")

    def continue_generation(self) -> None:
        self.calls.append("resume")

    def generate(self, request):  # the barrier's resume probe (t1ops.engines.checks)
        self.calls.append("probe")
        return P.GenerateResponse(output_ids=(1,), finish_reason=P.FinishReason(type="length", length=1),
                                  weight_version=self.version, prompt_tokens=1, completion_tokens=1, rid=request.rid)


class _DeferredSync:
    admits_alone = False

    def __init__(self, fail: set[int] = frozenset()) -> None:
        self.published: list[tuple[list[int], str]] = []
        self.fail = set(fail)

    def publish(self, targets, source, version):
        self.published.append(([i for i, _ in targets], version))
        for i, client in targets:
            if i not in self.fail:
                client.version = version
        return {i: "broadcast failed" for i, _ in targets if i in self.fail}

    def admit(self, client, source, version):
        raise AssertionError("never called when admits_alone is False")

    def expected_checksums(self, version):
        return None  # no trainer record: the barrier's load check is skipped


def _pool(versions: list[str], sync) -> tuple[EnginePool, list[_FakeClient]]:
    clients = [_FakeClient(f"http://e{i}", v) for i, v in enumerate(versions)]
    cfg = EngineConfig(num_engines=len(clients), health_interval_s=0.05, warmup_grace_s=0.0, request_timeout_s=1.0)
    pool = EnginePool(lambda slot: EngineHandle(url=clients[slot].base_url, client=clients[slot]), cfg,
                      version="0", weight_sync=sync)
    pool.start()
    return pool, clients


def test_engines_at_another_version_wait_then_join_at_the_transfer():
    sync = _DeferredSync()
    pool, clients = _pool(["0", "default"], sync)
    try:
        pool.wait_until_ready(timeout_s=30)
        assert pool.live_slots() == [0]  # engine 1 is healthy but not serving foreign weights
        report = pool.sync_weights("unused", "1")
        assert sync.published == [([0, 1], "1")] and report.live_slots == (0, 1)
        assert clients[0].calls == ["pause", "resume", "probe"] and clients[1].calls == []  # joined, never paused
        pool.sync_weights("unused", "2")
        assert sync.published[-1] == ([0, 1], "2") and pool.live_slots() == [0, 1]
    finally:
        pool.close()


def test_an_engine_the_transfer_fails_on_is_declared_dead():
    sync = _DeferredSync(fail={1})
    pool, _ = _pool(["default", "default"], sync)
    try:
        pool.wait_until_ready(timeout_s=30)
        since = time.time()
        report = pool.sync_weights("unused", "1")
        assert report.live_slots == (0,) and report.recreated_slots == (1,)  # dead, then recreated at once
        assert [e["slot"] for e in telemetry.recent_events("engine.dead", since) if "broadcast failed" in e["reason"]] == [1]
    finally:
        pool.close()


def test_the_transaction_in_three_calls_names_targets_by_url_and_an_aborted_one_keeps_the_gate_closed():
    """What the coordinator drives across processes (t1ops.campaign.barrier): open names (slot, url),
    the push happens elsewhere, pushed takes its result, close reopens the gate."""
    from t1ops.guards.weight_sync import Pushed

    pool, clients = _pool(["0", "0"], _DeferredSync())
    try:
        pool.wait_until_live(timeout_s=30)
        since = time.time()
        targets = pool.open_sync("ckpt-1", "1")
        assert targets == [(0, "http://e0"), (1, "http://e1")] and not pool.gate_open
        clients[0].version = "1"  # the pusher (another process) reached engine 0; engine 1 failed
        assert pool.pushed(Pushed(failures={1: "connection reset"}, source="export-1")) == []
        report = pool.close_sync()
        assert report.live_slots == (0,) and report.recreated_slots == (1,) and pool.gate_open and pool.version == "1"
        assert pool.table.admit_source == "export-1"  # what an engine admitted alone loads (disk sync)
        assert [e["slot"] for e in telemetry.recent_events("engine.dead", since) if "connection reset" in e["reason"]] == [1]
        pool.open_sync("ckpt-2", "2")
        pool.abort_sync("RuntimeError: the export failed")
        assert not pool.gate_open and pool.version == "1"  # nothing half-synced is served
        assert pool.table.sync_lock.acquire(timeout=1)  # ... and the next barrier can begin
        pool.table.sync_lock.release()
    finally:
        pool.close()
