"""Benchmark: peak resident bytes per trainer rank during a checkpoint save, before and after checkpoints
by shard, against the model's bytes (docs/parallelism.md, "Checkpoints by shard").

Real rank processes (gloo groups through ``t1ops.guards.dist``, megatron-core parallel state,
``RankTrainer``) of a model large enough that its bytes stand out of the process's noise. Each rank
takes one optimizer step (so Adam's state exists), then, in this order, each measured as the peak RSS
above the RSS just before it (``psutil``, sampled every millisecond by a thread; the smallest first,
so memory an earlier block freed to the allocator but not to the OS cannot hide a later block's):

- ``after``: the production save, ``save_sharded`` of both roles and ``save_rank_state``;
- ``sync by shard``: the weight sync as it runs now (docs/weights.md, "Every rank sends its shard"):
  every rank exports the tensors the plan gives it (``weight_export_here``, disk sync's file per rank)
  and hashes them for the barrier's checksums (``weight_checksums_here``): the walk that also feeds
  the distributed broadcast, each tensor-parallel tensor assembled from its pieces one at a time;
- ``sync gather``: the weight sync as it was until shard-fed sync (kept here only to measure it): the
  full actor gathered to rank 0 (``full_state("actor")``);
- ``before``: the save as it was until this change (kept here only to measure it): both roles gathered
  to rank 0 (``RankTrainer.full_state``), rank 0 writes them whole (``save_checkpoint``), every rank's
  optimizer and RNG state gathered to rank 0 as bytes.

The figures are anonymous resident bytes (``RssAnon``); the export also prints all resident pages,
which include the memory-mapped shards' file pages (page cache the kernel takes back under pressure).
Then the streaming HF export of the saved actor (``export_hf`` over a ``CheckpointReader``) is measured
against loading the checkpoint whole first, in this process.

Run: python bench/bench_ckpt_memory.py [--layout dp2|tp2ep2|both] [--hidden 512 --experts 8 --vocab 32768]
"""
from __future__ import annotations

import argparse
import io
import math
import os
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch
import torch.multiprocessing as mp

from rl import model as rmodel
from rl.megatron_cpu import teardown
from rl.trainer import TrainerSettings
from rl.trainer.ranks import Layout, RankTrainer, full_initial_states
from t1ops.campaign.rank_sync import RankSender
from t1ops.campaign.resume import rank_state, save_rank_state
from t1ops.campaign.trainer_rank import join_world
from t1ops.config import GuardsConfig
from t1ops.guards.checkpoints import save_checkpoint
from t1ops.guards.rendezvous import plan_rendezvous
from t1ops.guards.sharded_checkpoints import save_sharded

LAYOUTS = {"dp2": Layout(dp=2), "tp2ep2": Layout(tp=2, ep=2, sequence_parallel=True)}
MIB = 2**20


class Peak:
    """Peak resident bytes above those at entry, sampled every millisecond while the block runs: ``bytes``
    counts anonymous memory (``RssAnon``: what the process allocated and cannot give back to the page
    cache), ``rss`` all resident pages (a memory-mapped shard's file pages too, which the kernel reclaims)."""

    def __enter__(self):
        self.proc, self.stop = psutil.Process(), threading.Event()
        self.base_anon = self.peak_anon = _anon()
        self.base = self.peak = self.proc.memory_info().rss
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            self.peak_anon = max(self.peak_anon, _anon())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.peak, self.peak_anon = max(self.peak, self.proc.memory_info().rss), max(self.peak_anon, _anon())
        self.bytes, self.rss = self.peak_anon - self.base_anon, self.peak - self.base


def _anon() -> int:
    """This process's resident anonymous bytes (``/proc/self/status``: RssAnon)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no RssAnon (Linux only)")


def _bytes(state) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _rank(rank: int, world: int, init: str, spec, settings, layout: Layout, out: str) -> None:
    torch.set_num_threads(1)
    actor, critic = full_initial_states(spec, settings, 0, None)
    model_bytes = {"actor": _bytes(actor), "critic": _bytes(critic)}
    join_world(rank, world, init, layout, guards=GuardsConfig())
    rt = RankTrainer(spec, settings, layout, full_actor=actor, full_critic=critic, unk_id=None)
    del actor, critic
    for model, opt in ((rt.actor, rt.actor_optimizer), (rt.critic, rt.critic_optimizer)):
        for p in model.parameters():  # one step on zero gradients: Adam's state exists, as after training
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()
    base = Path(out) / "ckpt"
    shard_bytes = sum(_bytes(rt.shard(r)[1]) for r in ("actor", "critic"))
    torch.distributed.barrier()
    with Peak() as after:  # the production save: every rank its own shard and its own trainer state
        for r in ("actor", "critic"):
            save_sharded(base / "after", r, 1, rt)
        save_rank_state(base / "after", 1, rank, rt)
    sender = RankSender(rt, spec, rank, world, dtype="bfloat16")
    parts = sender.weight_channels("1")  # one export file per sending rank
    (Path(out) / "export").mkdir(exist_ok=True)
    torch.distributed.barrier()
    with Peak() as by_shard:
        sender.weight_export_here("1", str(Path(out) / "export"), parts)
        sender.weight_checksums_here("1")
    torch.distributed.barrier()
    with Peak() as sync:
        full = rt.full_state("actor")
        del full
    torch.distributed.barrier()
    with Peak() as before:  # the gather path as it was (rank 0 saved whole roles and gathered trainer states)
        full = {r: rt.full_state(r) for r in ("actor", "critic")}
        states = [None] * world if rank == 0 else None
        buf = io.BytesIO()
        torch.save(rank_state(rt), buf)
        torch.distributed.gather_object(buf.getvalue(), states, dst=0)
        if rank == 0:
            for r, state in full.items():
                save_checkpoint(base / "before" / r, r, 1, state)
            states = [torch.load(io.BytesIO(b), weights_only=True) for b in states]
        del full, states, buf
    torch.distributed.barrier()
    torch.save({"before": before.bytes, "after": after.bytes, "sync": sync.bytes, "shard": shard_bytes,
                "by_shard": by_shard.bytes, "owned": sum(math.prod(s.shape) * 4 for s in sender.weight_plan()
                                                         if s.owner == rank),
                **{f"model_{k}": v for k, v in model_bytes.items()}}, os.path.join(out, f"rank{rank}.pt"))
    teardown()


def measure(layout: Layout, spec, settings) -> list[dict]:
    out = tempfile.mkdtemp(prefix="t1ops-ckpt-mem-")
    init = plan_rendezvous("127.0.0.1")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, layout.world_size, init, spec, settings, layout, out))
             for r in range(layout.world_size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(1800)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
    return [{**torch.load(os.path.join(out, f"rank{r}.pt")), "out": out} for r in range(layout.world_size)]


def export_peak(step_dir: str | Path, spec, out: str | Path) -> tuple[int, int]:
    """Peak RSS above the start of the streaming HF export of an actor checkpoint by shard
    (``export_hf`` over a ``CheckpointReader``), and of loading it whole first, then exporting."""
    from rl.hf.checkpoint import export_hf
    from t1ops.guards.sharded_checkpoints import CheckpointReader, load_role

    with Peak() as streaming:
        export_hf(CheckpointReader(step_dir, "actor"), spec, Path(out) / "streaming", tokenizer=False)
    with Peak() as whole:
        state = load_role(step_dir, "actor")[0]
        export_hf(state, spec, Path(out) / "whole", tokenizer=False)
        del state
    return streaming.bytes, whole.bytes, streaming.rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=[*LAYOUTS, "both"], default="both")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spec = rmodel.ModelSpec(num_layers=2, hidden_size=args.hidden, num_attention_heads=8,
                            ffn_hidden_size=2 * args.hidden, num_experts=args.experts, moe_router_topk=2,
                            moe_ffn_hidden_size=args.hidden, max_seq_len=256, vocab_size=args.vocab)
    settings = TrainerSettings(mode="ppo")
    for name in (LAYOUTS if args.layout == "both" else [args.layout]):
        rows = measure(LAYOUTS[name], spec, settings)
        model = rows[0]["model_actor"] + rows[0]["model_critic"]
        print(f"{name}: model (actor + critic, fp32) {model / MIB:.1f} MiB; actor {rows[0]['model_actor'] / MIB:.1f} MiB")
        for r, row in enumerate(rows):
            print(f"  rank {r}: shard {row['shard'] / MIB:6.1f} MiB | save before {row['before'] / MIB:6.1f} MiB "
                  f"({row['before'] / model:.2f} x model) | save after {row['after'] / MIB:6.1f} MiB "
                  f"({row['after'] / model:.2f} x model)")
            print(f"          weight sync by shard {row['by_shard'] / MIB:6.1f} MiB "
                  f"({row['by_shard'] / row['model_actor']:.2f} x actor; it owns {row['owned'] / MIB:.1f} MiB of "
                  f"the actor) | sync gather as it was {row['sync'] / MIB:6.1f} MiB "
                  f"({row['sync'] / row['model_actor']:.2f} x actor)")
        out = rows[0]["out"]
        streaming, whole, mapped = export_peak(Path(out) / "ckpt" / "after" / "actor" / "step_00000001", spec, out)
        print(f"  export of the actor from the shards: streaming {streaming / MIB:.1f} MiB "
              f"({streaming / rows[0]['model_actor']:.2f} x actor; all resident pages incl. the mapped shards "
              f"{mapped / MIB:.1f} MiB) | loaded whole first {whole / MIB:.1f} MiB "
              f"({whole / rows[0]['model_actor']:.2f} x actor)")


if __name__ == "__main__":
    main()
