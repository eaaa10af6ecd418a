"""The documents' model from a checkpoint: load time against reading the bytes, and the engine's speed
on the hybrid against the Qwen3-MoE stand-in of the same size, both measured in this run.

    python bench/bench_model.py [--layers 8 --vocab 32768 --concurrency 1 8]

1. Load: ``t1ops model init`` writes a Qwen3.5-MoE checkpoint (transformers' save_pretrained); the
   baseline reads every byte of its safetensors files (page cache warm, best of 3); t1ops' load is
   ``HFCheckpoint`` (every check) + ``mcore_state`` (every unit converted to megatron's layout), and an
   ep = 2 rank's share (its experts only). Printed as seconds and ratios to the baseline.
2. Engine: the embedded engine (K/V + continuous batching, bf16) on the hybrid (3 GatedDeltaNet layers
   per gated attention layer, shared expert) and on a Qwen3-MoE with the same hidden size, layers,
   experts and vocabulary; multi-turn trajectories as bench/bench_engine.py sends them. Printed as
   generated tokens/s and the ratio hybrid / stand-in.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from bench_engine import tokens_per_s, trajectory  # the sibling benchmark (python bench/bench_model.py puts bench/ on the path)
from rl.engines.embedded_engine import EmbeddedEngine
from rl.hf.reader import CheckpointState, HFCheckpoint
from rl.model import ModelSpec
from rl.trainer.shard import is_expert
from rl.vocab import CompactVocab
from t1ops.commands.model import init_checkpoint


def best_of(fn, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def read_bytes(path: Path) -> int:
    total = 0
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 24):
                total += len(chunk)
    return total


def bench_load(args) -> ModelSpec:
    out = Path(tempfile.mkdtemp(prefix="t1ops-bench-model-")) / "ckpt"
    init_checkpoint("qwen3_5_moe", str(out), layers=args.layers, vocab_size=args.vocab)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    base = best_of(lambda: read_bytes(out))
    full = best_of(lambda: HFCheckpoint(out).mcore_state())
    ckpt = HFCheckpoint(out)
    state = CheckpointState(ckpt)
    mine = [n for n in state if not is_expert(n) or int(n.split("local_experts.")[1].split(".")[0]) % 2 == 0]
    rank = best_of(lambda: [state[n] for n in mine])
    print(f"checkpoint: {ckpt.spec.num_layers} layers, {size / 2**20:.1f} MiB of safetensors")
    print(f"  read the bytes           {base:7.3f} s  (baseline)")
    print(f"  check + load every unit  {full:7.3f} s  ratio {full / base:5.2f}x")
    print(f"  an ep = 2 rank's units   {rank:7.3f} s  ratio {rank / base:5.2f}x")
    return ckpt.spec


def bench_engine(spec: ModelSpec, args) -> None:
    vocab_size = 238  # the tiny campaign's compact vocabulary: the engine's cost is the layers, not the LM head
    hybrid = ModelSpec(**{**spec.to_dict(), "vocab_size": vocab_size, "max_seq_len": 1024})
    stand_in = ModelSpec(num_layers=hybrid.num_layers, hidden_size=hybrid.hidden_size, num_attention_heads=4,
                         num_query_groups=2, ffn_hidden_size=128, num_experts=hybrid.num_experts,
                         moe_router_topk=hybrid.moe_router_topk, moe_ffn_hidden_size=hybrid.moe_ffn_hidden_size,
                         max_seq_len=1024, vocab_size=vocab_size)
    vocab = CompactVocab.identity(vocab_size)
    engines = {"qwen3_moe": EmbeddedEngine(stand_in, vocab, torch.bfloat16, 0),
               "qwen3_5_moe": EmbeddedEngine(hybrid, vocab, torch.bfloat16, 0)}
    for engine in engines.values():
        trajectory(engine, 0, args)  # first-call allocations
    print(f"engine: {hybrid.num_layers} layers, hidden {hybrid.hidden_size}, bf16, {args.turns} turns x "
          f"{args.max_new} new tokens, prompt {args.prompt}; load average {os.getloadavg()[0]:.1f}")
    for n in args.concurrency:
        rates = {name: tokens_per_s(engine, n, args)[0] for name, engine in engines.items()}
        print(f"  {n:3d} concurrent  qwen3_moe {rates['qwen3_moe']:8.1f} tokens/s  qwen3_5_moe "
              f"{rates['qwen3_5_moe']:8.1f} tokens/s  ratio hybrid / stand-in {rates['qwen3_5_moe'] / rates['qwen3_moe']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32_768)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--obs", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    bench_engine(bench_load(args), args)


if __name__ == "__main__":
    main()
