"""Embedded engine throughput: K/V cache + continuous batching vs the recompute path, same run.

    python bench/bench_engine.py [--concurrency 1 8 32 --turns 2 --max-new 32 --prompt 256]

N concurrent multi-turn trajectories (threads calling ``EmbeddedEngine.generate``
in process, no HTTP), each turn's prompt the previous stream plus an
observation, as the agent loop sends them. The model is the tiny campaign's
(examples/tiny/campaign.toml [model]) at bf16 over a 238-id vocabulary; sampling
at temperature 1 with no stop token, so every turn generates ``--max-new``
tokens on both engines (the same work). Prints generated tokens per second
per engine and concurrency, and the ratio new / recompute (target >= 10x at 32).
Run under the shared lock on a busy machine; the load average is printed with
the figures.
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import torch

from rl.engines import protocol as P
from rl.engines.embedded_engine import EmbeddedEngine
from rl.model import ModelSpec
from rl.vocab import CompactVocab

REPO = Path(__file__).resolve().parent.parent
VOCAB = 238  # the tiny campaign's compact vocabulary


def tiny_spec() -> ModelSpec:
    from t1ops.config import load_toml

    model = load_toml(REPO / "examples" / "tiny" / "campaign.toml").model
    return ModelSpec(**{**ModelSpec.from_config(model).to_dict(), "vocab_size": VOCAB})


def trajectory(engine: EmbeddedEngine, seed: int, args) -> int:
    """One multi-turn trajectory; returns the tokens generated."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB - 1, (args.prompt,), generator=g).tolist()
    generated, routed = 0, 0
    for turn in range(args.turns):
        params = P.SamplingParams(max_new_tokens=args.max_new, temperature=1.0, sampling_seed=seed * 100 + turn)
        resp = engine.generate(P.GenerateRequest(input_ids=tuple(ids), sampling_params=params, return_logprob=True,
                                                 return_routed_experts=True, routed_experts_start_len=routed))
        generated += len(resp.output_ids)
        ids += list(resp.output_ids)
        routed = len(ids) - 1
        ids += torch.randint(0, VOCAB - 1, (args.obs,), generator=g).tolist()
    return generated


def tokens_per_s(engine: EmbeddedEngine, concurrency: int, args) -> tuple[float, int, float]:
    counts = [0] * concurrency

    def run(i: int) -> None:
        counts[i] = trajectory(engine, 1000 * concurrency + i, args)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return sum(counts) / wall, sum(counts), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256, help="first prompt length (tiny campaign: ~250)")
    ap.add_argument("--obs", type=int, default=16, help="observation tokens appended after each turn")
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec, vocab = tiny_spec(), CompactVocab.identity(VOCAB)
    engines = {"recompute": EmbeddedEngine(spec, vocab, torch.bfloat16, 0, batching=False),
               "kv+batching": EmbeddedEngine(spec, vocab, torch.bfloat16, 0)}
    trajectory(engines["kv+batching"], 0, args)  # warm both paths (first-call allocations)
    trajectory(engines["recompute"], 0, args)
    print(f"tiny campaign model, bf16, {args.turns} turns x {args.max_new} new tokens, prompt {args.prompt}, "
          f"observation {args.obs}; load average {os.getloadavg()[0]:.1f} at start")
    for n in args.concurrency:
        rates = {}
        for name, engine in engines.items():
            rates[name], tokens, wall = tokens_per_s(engine, n, args)
            print(f"  {n:3d} concurrent  {name:12s} {rates[name]:8.1f} tokens/s  ({tokens} tokens in {wall:.1f} s)")
        print(f"  {n:3d} concurrent  ratio kv+batching / recompute: {rates['kv+batching'] / rates['recompute']:.1f}x")
    print(f"load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
