"""The data plane: the coordinator carries refs; a worker's death after putting loses nothing;
the trainer fetches; the worker writes the dumps (t1ops.campaign.dataplane)."""
from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from t1ops.audit import read_trajectory
from t1ops.campaign import dataplane
from t1ops.campaign.async_buffer import spans_versions, version_lag_histogram


def _helpers():
    """Built inside a function so Ray pickles them by value (workers cannot import this test module)."""
    import numpy as np

    from rl.tito import Trajectory
    from t1ops.campaign import dataplane
    from t1ops.campaign.trials import TrialResult

    def chunk(n: int, version: int, layers: int = 4, topk: int = 2) -> Trajectory:
        mask = np.r_[np.zeros(n // 2, np.int8), np.ones(n - n // 2, np.int8)]
        return Trajectory(tokens=np.arange(n, dtype=np.int64), loss_mask=mask,
                          rollout_logprobs=np.full(n, -0.5, np.float32), engine_tokens=np.arange(n, dtype=np.int64),
                          origin=np.zeros(n, np.int8), policy_version=np.where(mask == 1, version, -1).astype(np.int32),
                          routing=np.ones((n, layers, topk), np.int32), meta={"sample_id": f"s{n}", "chunk_id": 0})

    def result(n: int, version: int) -> TrialResult:
        return TrialResult(reward=1.0, reward_source="ctrf", task="t", trial_id=f"trial-{n}", end_reason="done",
                           group_id="g", sample_id=f"g-s{n}", chunks=[chunk(n, version)])

    class Putter:
        """A rollout worker's staging and dump duty, nothing else."""

        def __init__(self, store) -> None:
            self.store = store

        def rollout(self, sizes: list[int], version: int) -> list[TrialResult]:
            return dataplane.stage([result(n, version) for n in sizes], self.store, 0)

        def write_dumps(self, dump_dir: str, step: int, items: list[TrialResult]) -> int:
            return dataplane.write_dump_items(dump_dir, step, items)

    return result, Putter


@pytest.fixture
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_refs_through_the_coordinator_chunks_from_the_store(ray_local, tmp_path):
    ray = ray_local
    _, Putter = _helpers()
    store = ray.remote(dataplane.TrajectoryStore).options(num_cpus=0).remote()
    putter = ray.remote(Putter).options(num_cpus=0).remote(store)
    slim = ray.get(putter.rollout.remote([4000, 8000], 3))
    # the coordinator's share: metadata and refs, a sliver of the trajectory bytes
    assert all(r.staged and r.chunks is None for r in slim)
    payload_bytes = sum(r.payload.nbytes for r in slim)
    assert payload_bytes >= 12000 * (8 + 1 + 4 + 8 + 1 + 4 + 4 * 2 * 4)
    assert len(pickle.dumps([r.replace(payload=None) for r in slim])) < 0.01 * payload_bytes
    # what the loops read from results works from metadata alone
    assert version_lag_histogram(slim, 4) == {1: 6000} and spans_versions(slim[0]) == [3]
    assert [r.loss_relations for r in slim] == [{"loss": 2000, "retokenized": 0}, {"loss": 4000, "retokenized": 0}]
    # the worker dies after returning: its objects are owned by the store and survive
    ray.kill(putter, no_restart=True)
    full = dataplane.fetch(slim)
    assert [len(r.chunks[0]) for r in full] == [4000, 8000]
    assert np.array_equal(full[1].chunks[0].routing, np.ones((8000, 4, 2), np.int32))
    # dumps: written by the (new) worker that holds them; the coordinator sends refs and metadata
    writer = ray.remote(Putter).options(num_cpus=0).remote(store)
    run = SimpleNamespace(dumps=tmp_path / "dumps")
    assert dataplane.write_dumps([writer], run, 7, slim) == 2
    dumped = read_trajectory(tmp_path / "dumps" / "s8000.c0.npz")
    assert dumped.meta["step"] == 7 and dumped.meta["trial_id"] == "trial-8000" and len(dumped) == 8000


def test_old_path_results_pass_through():
    result, _ = _helpers()
    old = [result(10, 0)]
    assert dataplane.stage(old, None, 0) is old and dataplane.fetch(old) is old
    assert dataplane.versions_of(old[0]) == {0: 5}


def test_each_dp_rank_fetches_only_its_shard(ray_local):
    """dp = 2: each rank fetches the full chunks (routing rows) of its own rows' trials only, the
    light arrays of all; the two shards are disjoint and cover the batch; a tp peer (same dp rank)
    fetches the same shard."""
    from rl.trainer.packing import pack_to_ranks

    ray = ray_local
    _, Putter = _helpers()
    store = ray.remote(dataplane.TrajectoryStore).options(num_cpus=0).remote()
    putter = ray.remote(Putter).options(num_cpus=0).remote(store)
    sizes = [3000, 500, 2000, 1200, 800, 2600]
    slim = ray.get(putter.rollout.remote(sizes, 1))
    total = sum(r.payload.nbytes for r in slim)
    got = {}
    for dp_rank in (0, 1, 0):  # the third call: rank 0's tp peer
        out, info = dataplane.fetch_shard(slim, lambda light: dataplane.shard_trials(light, 2, dp_rank))
        assert got.setdefault(dp_rank, info["fetched"]) == info["fetched"]
        want = sorted(pack_to_ranks(sizes, 2)[dp_rank])  # one chunk per trial: rows are trials
        assert info["fetched"] == want and info["staged"] == len(sizes)
        assert info["fetched_bytes"] == sum(slim[i].payload.nbytes for i in want) < 0.7 * total
        assert info["light_bytes"] == sum(sizes) * (8 + 1 + 4 + 8 + 1 + 4)  # every row, without routing rows
        for i, r in enumerate(out):  # every row is there, routing rows real where fetched, zero elsewhere
            (c,) = r.chunks
            assert len(c) == sizes[i] and c.routing.shape == (sizes[i], 4, 2)
            assert int(c.routing.max()) == (1 if i in want else 0)
    assert set(got[0]).isdisjoint(got[1]) and sorted(got[0] + got[1]) == list(range(len(sizes)))
    assert dataplane.batch_rows(out) == list(enumerate(sizes))
