"""Benchmark: trainer step time on 2 data-parallel ranks against 1 rank, measured in the same run.

Both runs are real rank processes (``t1ops.campaign.trainer_rank.run_local_ranks``:
gloo groups through ``t1ops.guards.dist``, megatron-core parallel state, the
``RankTrainer`` step with R3 replay) on the same batch and initial weights.
The first step of each run is a warm-up and is left out. On CPU the ratio
depends on free cores: two ranks need two idle cores to beat one.

Run: python bench/bench_ranks.py [--samples 16 --tokens 96 --steps 4 --layout dp2|tp2|ep2]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from rl import model as rmodel
from rl.trainer import Trainer, TrainerSettings, rollout_batch, sample_responses
from rl.trainer.ranks import Layout
from t1ops.campaign.trainer_rank import run_local_ranks

LAYOUTS = {"dp2": Layout(dp=2), "tp2": Layout(tp=2, sequence_parallel=True), "ep2": Layout(dp=2, ep=2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="dp2")
    args = ap.parse_args()
    spec = rmodel.ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, num_experts=8,
                            moe_router_topk=2, moe_ffn_hidden_size=64, max_seq_len=256, vocab_size=512)
    settings = TrainerSettings(mode="ppo", ppo_epochs=1, r3=True)
    t = Trainer(spec, settings, seed=0)
    seqs = sample_responses(t.actor, [[1, 2, 3, 4]] * args.samples, args.tokens - 4,
                            generator=torch.Generator().manual_seed(0))
    batch = rollout_batch(t.actor, seqs, [4] * args.samples, [0.01 * i for i in range(args.samples)],
                          list(range(args.samples)), list(range(args.samples)))
    results = {}
    for name, layout in (("1 rank", Layout()), (f"2 ranks ({args.layout})", LAYOUTS[args.layout])):
        got = run_local_ranks(layout, batch, spec, settings, seed=0, steps=args.steps)
        results[name] = statistics.median(got["step_s"][1:] or got["step_s"])
        print(f"{name:>18}: {results[name]:.3f} s/step (median of steps 2..{args.steps}), "
              f"{got['micro_batches']} micro-batch(es) per rank")
    base, two = results["1 rank"], results[f"2 ranks ({args.layout})"]
    print(f"2 ranks / 1 rank step time: {two / base:.2f}x ({args.samples} trajectories of {args.tokens} tokens)")


if __name__ == "__main__":
    main()
