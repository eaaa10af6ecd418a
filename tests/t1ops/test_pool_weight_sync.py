"""The pool's barrier with a WeightSync that cannot admit an engine alone (distributed sync).

Fake engines (no processes): what is checked is the pool's bookkeeping: an engine at another
version waits healthy and out of rotation, joins at publish_to_waiting / the next barrier, and
an engine the sync reports as failed is declared dead.
"""
from __future__ import annotations



from rl.engines import protocol as P
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
        assert pool.publish_to_waiting() == (1,)
        assert sync.published == [([1], "0")] and pool.live_slots() == [0, 1]
        report = pool.sync_weights("unused", "1")
        assert sync.published[-1] == ([0, 1], "1") and report.live_slots == (0, 1)
        assert all(c.calls == ["pause", "resume", "probe"] for c in clients)
    finally:
        pool.close()


def test_an_engine_the_transfer_fails_on_is_declared_dead():
    sync = _DeferredSync(fail={1})
    pool, _ = _pool(["default", "default"], sync)
    try:
        pool.wait_until_ready(timeout_s=30)
        assert pool.publish_to_waiting() == (0,)
        assert pool.slot_state(1)[0] == "dead" and "broadcast failed" in pool.slot_state(1)[1]
    finally:
        pool.close()
