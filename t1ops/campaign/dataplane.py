"""The trajectory data plane: workers put, the trainer fetches, the coordinator carries refs.

A step's trajectories (tokens, log-probs, versions and the R3 routing rows, 1,536 bytes per
token at the report's 48 layers x top-8: about 48 MiB for a 33k-token trajectory) never pass
through the coordinator (docs/scale.md):

- the rollout worker puts each finished trial's chunks into the Ray object store
  (:func:`stage`) and returns only the trial's metadata (reward, lengths, ledger, timings, the
  loss tokens per policy version) plus a :class:`Payload` naming the object;
- the objects are owned by the :class:`TrajectoryStore` actor, not by the worker (the worker
  hands each trial's chunks to the store, which puts them: Ray 2.56 removed ``ray.put``'s
  ``_owner``), so a worker that dies after returning loses nothing the coordinator acknowledged;
- the trainer fetches the chunks itself, straight from the store: a 1-rank trainer all of them
  (:func:`fetch`); a data-parallel rank only its own shard's (:func:`fetch_shard`: the light
  per-token arrays of every trial, which batch-wide statistics need, and the full chunks, routing
  rows included, of the trials its rows come from; tp/ep peers of a dp rank fetch the same);
- the dumps are written by the worker that holds the trial (:meth:`RolloutWorker.write_dumps`,
  fed refs and metadata by :func:`write_dumps`).

A :class:`~t1ops.campaign.trials.TrialResult` that still carries its chunks (a worker without a
store) takes the old path everywhere: every function here accepts both.

``ray`` is imported inside the functions that call it (the module's only in-function imports):
``t1ops.campaign.async_buffer``, pure Python and property-tested without Ray, imports
:func:`versions_of` from here.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from rl.tito import RETOKENIZED
from rl.trainer.packing import pack_to_ranks
from t1ops import telemetry
from t1ops.audit import write_trajectory
from t1ops.campaign.trials import TrialResult
from t1ops.tito_debug import write_debug


@dataclass(frozen=True)
class Payload:
    """Where a trial's chunks are: an object-store ref, and what the coordinator may know of them."""

    ref: Any           # ray.ObjectRef to list[rl.tito.Trajectory]
    num_chunks: int
    num_tokens: int
    nbytes: int
    worker: int        # index of the rollout worker that put it (it writes the dumps)
    light_ref: Any = None  # ray.ObjectRef to the same chunks without routing rows (:func:`light`)


class TrajectoryStore:
    """Owns the trajectories' objects (a named Ray actor, ``num_cpus=0``, one per run): it puts
    what a worker hands it and returns the references, so the objects outlive that worker: the
    chunks, and their light copy (no routing rows) that every trainer rank reads."""

    def hold(self, chunks) -> list:
        import ray

        # refs inside a list: the caller borrows them, this actor owns them
        return [ray.put(chunks), ray.put([light(c) for c in chunks])]

    def ping(self) -> bool:
        return True


def loss_versions(chunks) -> dict[int, int]:
    """Loss-bearing tokens by the policy version that sampled them."""
    out: Counter = Counter()
    for c in chunks:
        vs, n = np.unique(np.asarray(c.policy_version)[np.asarray(c.loss_mask) == 1], return_counts=True)
        for v, k in zip(vs.tolist(), n.tolist()):
            out[int(v)] += int(k)
    return dict(out)


def loss_relations(chunks) -> dict[str, int]:
    """Loss-bearing tokens, and those of them that went through the retokenized or split TITO relations
    (a split chunk's every loss token; health.retokenized, ``t1ops.guards.run_health``)."""
    loss = odd = 0
    for c in chunks:
        mask = np.asarray(c.loss_mask) == 1
        loss += int(mask.sum())
        split = "split" in (c.meta or {}).get("relations", ())
        odd += int(mask.sum()) if split else int((mask & (np.asarray(c.origin) == RETOKENIZED)).sum())
    return {"loss": loss, "retokenized": odd}


def chunk_bytes(chunks) -> int:
    arrays = ("tokens", "loss_mask", "rollout_logprobs", "engine_tokens", "origin", "policy_version", "routing")
    return sum(getattr(c, a).nbytes for c in chunks for a in arrays if getattr(c, a, None) is not None)


def stage(results: list[TrialResult], store, worker: int) -> list[TrialResult]:
    """Worker side: put each result's chunks in the object store (owned by ``store``); return the
    results with ``payload``, ``loss_versions`` and ``loss_relations`` instead of ``chunks``. ``store`` None:
    the results are returned as they are (the old path)."""
    if store is None:
        return results
    import ray

    held = ray.get([store.hold.remote(r.chunks) for r in results])
    out = []
    for r, (ref, light_ref) in zip(results, held):
        chunks = r.chunks
        out.append(r.replace(chunks=None, loss_versions=loss_versions(chunks), loss_relations=loss_relations(chunks),
                             payload=Payload(ref, len(chunks), sum(len(c.tokens) for c in chunks),
                                             chunk_bytes(chunks), worker, light_ref)))
    return out


def versions_of(result: TrialResult) -> dict[int, int]:
    """Loss tokens by policy version of one result, staged or not."""
    if result.loss_versions is not None:
        return {int(k): v for k, v in result.loss_versions.items()}
    return loss_versions(result.chunks)


def fetch(results: list[TrialResult]) -> list[TrialResult]:
    """Trainer side: the results with their chunks, fetched from the object store in one call."""
    staged = [i for i, r in enumerate(results) if r.staged]
    if not staged:
        return results
    import ray

    chunks = ray.get([results[i].payload.ref for i in staged])
    out = list(results)
    for i, c in zip(staged, chunks):
        out[i] = results[i].replace(chunks=c)
    return out


ROUTING_ROWS = "routing_rows"  # a light chunk's meta: (shape of one token's rows, dtype) of the routing it lacks


def light(chunk):
    """The chunk without its routing rows (1,536 B/token at the report's scale; the rest is ~26 B)."""
    if chunk.routing is None:
        return chunk
    return replace(chunk, routing=None,
                   meta={**chunk.meta, ROUTING_ROWS: (tuple(chunk.routing.shape[1:]), str(chunk.routing.dtype))})


def _placeholder(chunk):
    """A light chunk as a batch row that this rank never runs: zero routing rows of the right shape
    (a read-only view, no copy), so the batch's layout and every batch-wide statistic are unchanged."""
    if ROUTING_ROWS not in chunk.meta:
        return chunk
    tail, dtype = chunk.meta[ROUTING_ROWS]
    zeros = np.broadcast_to(np.zeros((1, *tail), dtype=dtype), (len(chunk.tokens), *tail))
    return replace(chunk, routing=zeros, meta={k: v for k, v in chunk.meta.items() if k != ROUTING_ROWS})


def batch_rows(trials: list[TrialResult]) -> list[tuple[int, int]]:
    """(trial index, tokens) of every row of the batch the trainer builds from the credit stage's
    trainable ``trials`` (``TrainerHost.build_batch``: every chunk of each, in order)."""
    return [(i, len(c.tokens)) for i, r in enumerate(trials) for c in r.chunks]


def shard_trials(trials: list[TrialResult], dp: int, dp_rank: int) -> set[int]:
    """Trials whose rows data-parallel rank ``dp_rank`` of ``dp`` trains: the split of
    ``rl.trainer.ranks.RankTrainer.plan`` (``pack_to_ranks`` over the rows' token counts)."""
    rows = batch_rows(trials)
    if len(rows) < dp:  # the trainer refuses this batch with its own error: fetch everything
        return set(range(len(trials)))
    return {rows[j][0] for j in pack_to_ranks([n for _, n in rows], dp)[dp_rank]}


def fetch_shard(results: list[TrialResult],
                owned: Callable[[list[TrialResult]], set[int]]) -> tuple[list[TrialResult], dict]:
    """Trainer-rank side: every staged result's light chunks (routing rows: zero placeholders), then
    the full chunks of the trials ``owned(light results)`` names. Returns the results and what was
    fetched: ``staged`` (count), ``fetched`` (indices of the trials fetched in full),
    ``fetched_bytes`` (their chunk bytes), ``light_bytes``. Results that carry their chunks (the
    old path) or were staged without a light copy are used or fetched whole."""
    staged = [i for i, r in enumerate(results) if r.staged]
    if not staged or any(results[i].payload.light_ref is None for i in staged):
        return fetch(results), {"staged": len(staged), "fetched": staged, "light_bytes": 0,
                                "fetched_bytes": sum(results[i].payload.nbytes for i in staged)}
    import ray

    lights = ray.get([results[i].payload.light_ref for i in staged])
    out = list(results)
    for i, cs in zip(staged, lights):
        out[i] = results[i].replace(chunks=[_placeholder(c) for c in cs])
    mine = sorted(set(owned(out)) & set(staged))
    for i, cs in zip(mine, ray.get([results[i].payload.ref for i in mine])):
        out[i] = results[i].replace(chunks=cs)
    return out, {"staged": len(staged), "fetched": mine, "light_bytes": sum(chunk_bytes(cs) for cs in lights),
                 "fetched_bytes": sum(results[i].payload.nbytes for i in mine)}


def write_dumps(workers: list, run, step: int, results: list[TrialResult], debug: bool = False) -> int:
    """Have each worker write the dumps of the trials it holds; results that carry their chunks
    (the old path) are written here. Returns the chunks written. ``debug`` (rollout.debug_dump):
    each trajectory's TITO debug files are written here (t1ops/tito_debug.py)."""
    import ray

    local = [r for r in results if not r.staged]
    n = dump_results(run, step, local, debug=debug) if local else 0
    if debug:  # a debugging switch: fetching the chunks to the coordinator is its accepted cost

        for r in fetch([r for r in results if r.staged and r.payload is not None]):
            if r.chunks:
                write_debug(run.path / "debug", r)
    by_worker: dict[int, list[TrialResult]] = {}
    for r in results:
        if r.staged:
            by_worker.setdefault(r.payload.worker, []).append(_dump_meta(r))
    calls = {i: workers[i % len(workers)].write_dumps.remote(str(run.dumps), step, items)
             for i, items in by_worker.items()}
    for i, call in calls.items():
        try:
            n += ray.get(call)
        except ray.exceptions.RayError as err:  # the worker is gone for good: fetch and write here
            telemetry.event("dataplane.dump_fallback", severity="warn", worker=i, error=str(err)[:300])
            n += dump_results(run, step, fetch([r for r in results if r.payload is not None
                                                and r.payload.worker == i]))  # debug files: written above
    return n


def _dump_meta(r: TrialResult) -> TrialResult:
    """What a worker needs to write a trial's dumps: its payload and provenance, nothing bulky."""
    return TrialResult(task=r.task, group_id=r.group_id, sample_id=r.sample_id, reward=r.reward,
                       trial_id=r.trial_id, reward_source=r.reward_source, end_reason=r.end_reason, payload=r.payload)


def write_dump_items(dump_dir: str, step: int, items: list[TrialResult]) -> int:
    """Worker side of :func:`write_dumps` (runs in a thread of the worker)."""
    import ray

    chunks = ray.get([it.payload.ref for it in items])
    return sum(_write_chunks(dump_dir, step, it, cs) for it, cs in zip(items, chunks))


def dump_results(run, step: int, results: list[TrialResult], debug: bool = False) -> int:
    """Write every trajectory chunk of results that carry them, in the audit dump format; returns
    the count. ``debug`` (rollout.debug_dump): also each trajectory's TITO debug files."""
    n = 0
    for r in results:
        n += _write_chunks(run.dumps, step, r, r.chunks)
        if debug and r.chunks:
            write_debug(run.path / "debug", r)
    return n


def _write_chunks(dump_dir, step: int, meta: TrialResult, chunks: list) -> int:
    """One trial's chunks, each written with the trial's reward and provenance (t1ops.audit)."""
    for chunk in chunks:
        write_trajectory(chunk, dump_dir, step=step, reward=meta.reward, reward_source=meta.reward_source,
                         task=meta.task, trial_id=meta.trial_id, end_reason=meta.end_reason)
    return len(chunks)
