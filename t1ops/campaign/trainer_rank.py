"""Trainer ranks: each joins its process group through ``t1ops.guards.dist``, then megatron's.

:func:`join_world` is what every rank process runs before it builds a
:class:`~rl.trainer.ranks.RankTrainer`: the default group is created by
:func:`t1ops.guards.dist.init_process_group` with the configured timeout
(gloo on CPU; NCCL with ``apply_nccl_env`` when CUDA is present), then
``rl.megatron_cpu.init_model_parallel`` builds megatron's TP/EP/DP groups
with the same timeout. A group without an explicit timeout is refused.

:func:`run_local_ranks` starts ``world`` local rank processes
(``torch.multiprocessing``, spawn) that take one step on a given batch and
report rank 0's numbers: the equivalence tests and ``bench/bench_ranks.py``
use it; the campaign runs one Ray actor per rank instead
(``t1ops.campaign.rank_actors``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from datetime import timedelta

import numpy as np
import torch
import torch.multiprocessing as mp

from rl import model as rmodel
from rl.megatron_cpu import init_model_parallel, teardown
from rl.trainer import TrainerSettings, rollout_batch
from rl.trainer.activations import SavedActivations
from rl.trainer.packing import pack_to_ranks
from rl.trainer.ranks import Layout, RankTrainer, full_initial_states
from t1ops.campaign.rank_sync import RankSender
from t1ops.campaign.resume import restore_rank_state, save_rank_states, save_trainer_state, trainer_state
from t1ops.config import GuardsConfig
from t1ops.guards import dist as dist_guard
from t1ops.guards.field_config import FieldGuardsConfig
from t1ops.guards.rendezvous import plan_rendezvous
from t1ops.guards.sharded_checkpoints import load_into, save_sharded
from t1ops.preflight.calibration import (
    ACTIVATION_CAP_TOKENS,
    ACTIVATION_LONG_TOKENS,
    ACTIVATION_SAMPLES,
)
from t1ops.preflight.cpu_activations import LAYOUTS as ACTIVATION_LAYOUTS
from t1ops.preflight.cpu_activations import TINY_HYBRID


def backend_for(requested: str = "auto") -> str:
    """``auto``: NCCL where CUDA exists, gloo on CPU."""
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return requested


def join_world(rank: int, world_size: int, init_method: str, layout: Layout, *, guards: GuardsConfig,
               seed: int = 0, backend: str = "auto", timeout: timedelta | None = None) -> timedelta:
    """Create this rank's default process group and megatron's parallel state; returns the timeout used.

    ``timeout`` defaults to the configured one (``timeout_for(backend, guards)``); a caller may pass a
    scaled one (chaos scenarios), never None to the group itself.
    """
    backend = backend_for(backend)
    timeout = timeout or dist_guard.timeout_for(backend, guards)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist_guard.init_process_group(backend, timeout=timeout, guards=guards, init_method=init_method,
                                  rank=rank, world_size=world_size)
    init_model_parallel(tp=layout.tp, pp=layout.pp, ep=layout.ep, cp=layout.cp, seed=seed,
                        timeout_s=timeout.total_seconds())
    return timeout


def own_shard_only(batch, dp: int, dp_rank: int):
    """The batch as data-parallel rank ``dp_rank`` holds it in a campaign (``dataplane.fetch_shard``):
    the routing rows of the rows other ranks train are zero placeholders, never fetched."""
    if batch.routing_BTLK is None:
        return batch
    others = torch.ones(batch.num_samples, dtype=torch.bool)
    others[pack_to_ranks(batch.num_tokens_B.tolist(), dp)[dp_rank]] = False
    routing = batch.routing_BTLK.clone()
    routing[others] = 0
    return dataclasses.replace(batch, routing_BTLK=routing)


def _one_step(rank: int, world: int, init_method: str, job: dict, out) -> None:
    """A spawned rank: full initial weights in a world of 1, join the world, logprobs + one step."""
    torch.set_num_threads(1)

    layout = job["layout"]
    actor, critic = full_initial_states(job["spec"], job["settings"], job["seed"], job["unk_id"])
    join_world(rank, world, init_method, layout, guards=job["guards"], seed=job["seed"])
    try:
        rt = RankTrainer(job["spec"], job["settings"], layout, full_actor=actor, full_critic=critic,
                         unk_id=job["unk_id"], seed=job["seed"], temperature=job["temperature"])
        loaded = {role: load_into(rt, role, path, rank) for role, path in (job.get("load_from") or {}).items()}
        if job.get("state_from"):  # the optimizer and RNG state too, re-sharded when saved at another layout
            loaded["trainer_state"] = restore_rank_state(rt, *job["state_from"], rank, world)[1]
        if job.get("own_shard"):
            job["batch"] = own_shard_only(job["batch"], layout.dp, rt.dp_rank)
        logprobs = rt.logprobs(job["batch"])
        times, stats = [], None
        saved = SavedActivations([rt.actor, rt.critic])
        for _ in range(job["steps"]):
            t0 = time.perf_counter()
            with saved if job["activations"] else contextlib.nullcontext():
                stats = rt.train_step(job["batch"], behaviour=job["behaviour"])
            times.append(time.perf_counter() - t0)
        if job["activations"]:
            torch.save(saved.peak_bytes, _activations_file(out, rank))
        full = {role: rt.full_state(role) for role in ("actor", "critic") if role == "actor" or rt.critic is not None}
        sync = _sync_parts(rt, job, rank, world) if job.get("sync_to") else None
        if job.get("shards_to"):
            for role in full:
                save_sharded(job["shards_to"], role, job["steps"], rt)
            _save_state(rt, job["shards_to"], job["steps"], rank, world)
        loads = [None] * world if rank == 0 else None
        torch.distributed.gather_object(loaded, loads, dst=0)
        if rank == 0:  # a file, not a queue: shared-memory tensors die with this process
            torch.save({"logprobs": logprobs, "stats": stats and stats.as_dict(), "step_s": times, "sync": sync,
                        "actor": full["actor"], "critic": full.get("critic"), "loaded": loads,
                        "micro_batches": len(rt.plan(job["batch"]))}, out)
    finally:
        teardown()


def _save_state(rt, base: str, step: int, rank: int, world: int) -> None:
    """Every rank's optimizer and RNG state in its own file; rank 0 commits the step (as a campaign's publish)."""
    entries = save_rank_states(base, step, rank, world, rt)
    if rank == 0:
        save_trainer_state(base, step, trainer_state(rt, step, None), entries)
    torch.distributed.barrier()


def _sync_parts(rt, job: dict, rank: int, world: int):
    """Every rank's part of the weight sync of its actor now (``t1ops.campaign.rank_sync``): its export file
    under ``job["sync_to"]`` and its checksums; rank 0 gets ``[({hf name: file}, {name: checksum})]`` by rank."""
    os.makedirs(job["sync_to"], exist_ok=True)
    sender = RankSender(rt, job["spec"], rank, world, dtype="float32")
    parts = sender.weight_channels("1")  # one export file per sending rank
    mine = (sender.weight_export_here("1", job["sync_to"], parts), sender.weight_checksums_here("1"))
    every = [None] * world if rank == 0 else None
    torch.distributed.gather_object(mine, every, dst=0)
    return every


def _activations_file(out: str, rank: int) -> str:
    return os.path.join(os.path.dirname(out), f"activations{rank}.pt")


def run_local_ranks(layout: Layout, batch, spec, settings, *, seed: int = 0, unk_id: int | None = None,
                    steps: int = 1, temperature: float = 1.0, timeout_s: float = 600.0,
                    shards_to: str | None = None, behaviour: str = "snapshot", own_shard: bool = False,
                    activations: bool = False, load_from: dict[str, str] | None = None,
                    sync_to: str | None = None, state_from: tuple[str, int] | None = None) -> dict:
    """Spawn ``layout.world_size`` local ranks, take ``steps`` steps on ``batch``; rank 0's results.

    Returns ``logprobs`` (full ``[B, T]`` before the step), ``stats`` (StepStats of the last step),
    ``step_s`` (seconds per step), ``actor`` and ``critic`` (the full states after the steps). With
    ``shards_to`` the ranks also save both roles by shard there, and their trainer state (step = ``steps``);
    ``state_from`` ((base, step)): each rank restores its optimizer and RNG state from there before the
    steps (re-sharded from every saved rank at another layout; ``loaded[..]["trainer_state"]``); ``load_from``
    ({role: step directory}): each rank loads its shard from that checkpoint before the steps
    (``RankTrainer.load_role``; ``loaded``: each rank's "own shard" / "re-sharded"). ``behaviour``:
    as ``RankTrainer.train_step``'s ("rollout": the fully async behaviour policy). ``own_shard``:
    each rank's batch carries routing rows only for its own data-parallel rows (:func:`own_shard_only`).
    ``activations``: also ``activation_peak_bytes``, every rank's peak of the bytes autograd saves for
    backward during the steps (:class:`rl.trainer.activations.SavedActivations`), in rank order.
    ``sync_to``: every rank also runs its part of the weight sync after the steps (its export file there,
    its checksums; ``sync``: each rank's ``({hf name: file}, {name: checksum})``, in rank order)."""
    ctx = mp.get_context("spawn")
    out = os.path.join(tempfile.mkdtemp(prefix="t1ops-ranks-"), "rank0.pt")
    # One fresh port per rendezvous attempt, as a campaign's ranks meet (group-init-race): a single
    # free_port() can be taken by another process before rank 0 binds it, and then rank 1 waits out
    # the whole window for a rank 0 that died of EADDRINUSE. A minute per attempt: the ranks build
    # their initial weights first, seconds apart on a loaded host.
    guards = GuardsConfig(field=FieldGuardsConfig(group_init_timeout_s=60.0))
    job = {"layout": layout, "batch": batch, "spec": spec, "settings": settings, "seed": seed,
           "unk_id": unk_id, "steps": steps, "temperature": temperature, "shards_to": shards_to,
           "behaviour": behaviour, "own_shard": own_shard, "guards": guards, "activations": activations,
           "load_from": load_from, "sync_to": sync_to, "state_from": state_from}
    init_method = plan_rendezvous("127.0.0.1", guards.field)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    procs = [ctx.Process(target=_one_step, args=(r, layout.world_size, init_method, job, out), daemon=True)
             for r in range(layout.world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        bad = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            raise RuntimeError(f"trainer ranks failed or timed out (rank, exit code): {bad}")
        result = torch.load(out, weights_only=False)
        if activations:
            result["activation_peak_bytes"] = [torch.load(_activations_file(out, r)) for r in range(layout.world_size)]
        return result
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def measure_layouts(names=tuple(ACTIVATION_LAYOUTS), *, long_tokens: int = ACTIVATION_LONG_TOKENS,
                    cap: int = ACTIVATION_CAP_TOKENS, samples: int = ACTIVATION_SAMPLES,
                    timeout_s: float = 600.0) -> dict[str, list[int]]:
    """Each layout's per-rank peak of saved-for-backward bytes over one PPO step (actor and critic, R3) of
    the tiny hybrid on gloo ranks (preflight's CPU calibration, ``t1ops.preflight.cpu_activations``); every layout trains the same batch from the same weights."""
    spec = rmodel.ModelSpec(**{**TINY_HYBRID, "max_seq_len": long_tokens})
    rng = np.random.default_rng(0)
    lengths = [long_tokens] + [cap] * (samples - 1)
    seqs = [rng.integers(0, spec.vocab_size, n).astype(np.int64) for n in lengths]
    sampler = rmodel.build_policy(spec, seed=7)
    batch = rollout_batch(sampler, seqs, [4] * samples, [0.1 * i for i in range(samples)],
                          [i // 2 for i in range(samples)], [i // 2 for i in range(samples)])
    settings = TrainerSettings(mode="ppo", ppo_epochs=1, r3=True)
    out = {}
    for name in names:
        tp, pp, cp = ACTIVATION_LAYOUTS[name]
        layout = Layout(tp=tp, pp=pp, cp=cp, sequence_parallel=tp > 1, max_tokens_per_gpu=cap)
        got = run_local_ranks(layout, batch, spec, settings, seed=0, timeout_s=timeout_s, activations=True)
        out[name] = got["activation_peak_bytes"]
    return out
