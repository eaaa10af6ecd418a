"""Trajectories through the coordinator (old) vs through the object store (new), same run.

    python bench/bench_dataplane.py [--trajectories 16 --lengths 8192 16384 33000 --workers 2]

Synthetic trials with the report's sizes: tokens, log-probs, versions and R3 routing rows for
48 layers x top-8 (int32: 1,536 bytes per token, ~48 MiB for a 33k-token trajectory). Two
rollout-worker actors build them and return them the way ``RolloutWorker.rollout`` does (the
old path: the chunks in the result; the new path: ``t1ops.campaign.dataplane.stage`` with a
``TrajectoryStore`` owner). The coordinator (this process) runs the production collect path
(``t1ops.campaign.rollouts.Rollouts.submit`` / ``collect``) and hands the results to a
trainer actor that fetches them (``dataplane.fetch``) and reads every byte. Per path and
length it prints: the bytes the coordinator received (Ray's serialized size of what
``collect`` returned; it sends the same again to the trainer) per byte of trajectory, the
coordinator's peak RSS growth during collect + hand-off, and the seconds from submission
to the trainer holding the batch, and the largest share of the batch one of 2 data-parallel
trainer ranks fetches (``dataplane.fetch_shard``: ~0.5; the old path: every rank gets it all).

Sized for a small shared host: the default is 16 trajectories per step (the report's step
is 512, the issue's example 64: ``--trajectories 64`` needs ~7 GiB of object store at 33k).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time

import numpy as np
import psutil

LAYERS, TOPK = 48, 8   # the report's model: 48 MoE layers, top-8 routing (1,536 B/token as int32)


def synthetic_chunk(n: int, seed: int):
    from rl.tito import Trajectory

    rng = np.random.default_rng(seed)
    mask = (np.arange(n) % 4 != 0).astype(np.int8)  # a quarter prompt/observation, the rest sampled
    return Trajectory(tokens=rng.integers(0, 248320, n, dtype=np.int64), loss_mask=mask,
                      rollout_logprobs=rng.standard_normal(n).astype(np.float32),
                      engine_tokens=rng.integers(0, 248320, n, dtype=np.int64), origin=np.zeros(n, np.int8),
                      policy_version=np.where(mask == 1, 0, -1).astype(np.int32),
                      routing=rng.integers(0, 256, (n, LAYERS, TOPK), dtype=np.int32),
                      meta={"sample_id": f"syn-{seed}", "chunk_id": 0})


class SyntheticWorker:
    """The parts of RolloutWorker the collect path calls; trials are synthetic, sizes real."""

    def __init__(self, index: int, length: int, store) -> None:
        self.index, self.length, self.store, self.finished = index, length, store, 0

    def pid(self) -> int:
        return os.getpid()

    def progress(self) -> int:
        return self.finished

    async def rollout(self, step: int, groups, accept_groups=None, trace=None):
        from t1ops.campaign.dataplane import stage
        from t1ops.campaign.trials import BatchResult, TrialResult

        results = []
        for g in groups:
            for spec in g:
                seed = hash((step, spec.group_id, spec.sample_idx)) % (1 << 31)
                results.append(TrialResult(trial_id=f"{spec.group_id}-{spec.sample_idx}", task=spec.task, reward=1.0,
                                           reward_source="ctrf", passed=1, total=1, num_turns=22, end_reason="done",
                                           group_id=spec.group_id, sample_id=f"{spec.group_id}-s{spec.sample_idx}",
                                           chunks=[synthetic_chunk(self.length, seed)]))
                self.finished += 1
        n = len(results)
        return BatchResult(results=await asyncio.to_thread(stage, results, self.store, self.index),
                           node=f"bench-{self.index}", failed={}, skim={"accepted": {}, "cancelled": {}},
                           ledger={"expected": n, "completed": n, "failed": 0, "cancelled": 0, "missing": 0})


class SinkTrainer:
    def train(self, results: list) -> int:
        """Fetch the batch (the trainer's side of the data plane) and read every routing byte."""
        from t1ops.campaign.dataplane import fetch

        total = 0
        for r in fetch(results):
            for c in r.chunks:
                total += int(c.routing[:, :, 0].sum() % 7) + c.routing.nbytes + c.tokens.nbytes
        return total

    def rank_bytes(self, results: list, dp: int) -> list[int]:
        """Bytes each of ``dp`` data-parallel ranks fetches (``dataplane.fetch_shard``; the old path:
        the whole batch, which every rank receives)."""
        from t1ops.campaign.dataplane import fetch_shard, shard_trials

        out = []
        for rank in range(dp):
            _, info = fetch_shard(results, lambda light: shard_trials(light, dp, rank))
            out.append(info["fetched_bytes"] + info["light_bytes"])
        return out


class PeakRss:
    def __init__(self) -> None:
        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()

    def __enter__(self) -> "PeakRss":
        self.base = self.peak = self.proc.memory_info().rss
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def serialized_bytes(value) -> int:
    """What Ray moves for ``value``: its serialized size (ObjectRefs count as their ids)."""
    import ray

    ctx = ray._private.worker.global_worker.get_serialization_context()
    return ctx.serialize(value).total_bytes


def one_step(ray, path: str, length: int, args, cfg) -> dict:
    from t1ops.campaign.dataplane import TrajectoryStore
    from t1ops.campaign.rollouts import Rollouts
    from t1ops.guards.fds import StallDetector

    store = ray.remote(TrajectoryStore).options(num_cpus=0).remote() if path == "new" else None
    workers = [ray.remote(SyntheticWorker).options(num_cpus=0).remote(i, length, store) for i in range(args.workers)]
    trainer = ray.remote(SinkTrainer).options(num_cpus=0).remote()
    rollouts = Rollouts(cfg, workers, [f"task-{i}" for i in range(args.trajectories)], StallDetector(600.0))
    traj_bytes = args.trajectories * length * (8 + 1 + 4 + 8 + 1 + 4 + LAYERS * TOPK * 4)
    with PeakRss() as rss:
        t0 = time.perf_counter()
        results, _, books = rollouts.collect(rollouts.submit(1))
        t_collect = time.perf_counter() - t0
        received = serialized_bytes(results)
        touched = ray.get(trainer.train.remote(results))
        t_step = time.perf_counter() - t0
    per_rank = ray.get(trainer.rank_bytes.remote(results, 2)) if path == "new" else [received, received]
    assert books["completed"] == args.trajectories and touched >= traj_bytes * 0.9
    del results
    for a in [*workers, trainer, *([store] if store is not None else [])]:
        ray.kill(a)
    return {"received": received, "traj_bytes": traj_bytes, "rss_growth": rss.peak - rss.base, "rss_peak": rss.peak,
            "collect_s": t_collect, "step_s": t_step, "rank_bytes": max(per_rank)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=16)
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 33000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--object-store-gib", type=float, default=3.0)
    args = ap.parse_args()
    import ray

    from t1ops.config import load_toml

    cfg = load_toml(os.path.join(os.path.dirname(__file__), "..", "examples", "tiny", "campaign.toml"))
    cfg.rollout.batch_size, cfg.rollout.n_samples_per_prompt = args.trajectories, 1
    for attempt in range(20):  # a loaded host can time a local Ray's start-up out: start it again
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                     object_store_memory=int(args.object_store_gib * (1 << 30)))
            break
        except Exception as err:
            if "timed out during startup" not in str(err) or attempt == 19:
                raise
            print(f"Ray start-up timed out (load {os.getloadavg()[0]:.1f}); retrying", flush=True)
    print(f"{args.trajectories} synthetic trajectories per step, routing {LAYERS} layers x top-{TOPK} int32 "
          f"({LAYERS * TOPK * 4} B/token), {args.workers} workers; load average {os.getloadavg()[0]:.1f}")
    print(f"{'path':5s} {'tokens':>7s} {'MiB/step':>9s} {'coord bytes/traj byte':>22s} {'coord RSS +MiB':>15s} "
          f"{'coord peak MiB':>15s} {'collect s':>10s} {'to trainer s':>13s} {'dp=2 rank/batch':>16s}")
    rows = {}
    try:
        for path in ("new", "old"):  # new first: the old path's allocations stay in this process
            for length in args.lengths:
                r = rows[(path, length)] = one_step(ray, path, length, args, cfg)
                print(f"{path:5s} {length:7d} {r['traj_bytes'] / 2**20:9.0f} {r['received'] / r['traj_bytes']:22.5f} "
                      f"{r['rss_growth'] / 2**20:15.1f} {r['rss_peak'] / 2**20:15.1f} {r['collect_s']:10.2f} {r['step_s']:13.2f} "
                      f"{r['rank_bytes'] / r['traj_bytes']:16.3f}", flush=True)
    finally:
        ray.shutdown()
    for path in ("new", "old"):
        growth = [rows[(path, n)]["rss_growth"] for n in args.lengths]
        base = [rows[(path, n)]["rss_peak"] - rows[(path, n)]["rss_growth"] for n in args.lengths]
        ratio = max(rows[(path, n)]["received"] / rows[(path, n)]["traj_bytes"] for n in args.lengths)
        overhead = [rows[(path, n)]["step_s"] for n in args.lengths]
        print(f"{path}: coordinator bytes per trajectory byte <= {ratio:.5f} (goal <= 0.01); coordinator RSS growth "
              f"in a step {min(growth) / 2**20:.1f}-{max(growth) / 2**20:.1f} MiB over {args.lengths[0]}-"
              f"{args.lengths[-1]} tokens, at most {100 * max(g / b for g, b in zip(growth, base)):.1f}% of its RSS "
              f"(goal flat within 10%); submission to trainer " + ", ".join(f"{s:.2f}" for s in overhead) + " s")
    print(f"load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
