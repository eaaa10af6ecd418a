"""Benchmark: activation bytes per token per rank by layout on CPU ranks, against the memory model.

One PPO step of the tiny Qwen3.5-MoE hybrid at each layout on real gloo ranks, same batch and weights
(``t1ops.campaign.trainer_rank.measure_layouts``); per layout the worst rank's peak of the bytes
autograd saves for backward per token of the long sample, the memory model's prediction for the same
shape and layout (``model_bytes_per_token``) and both ratios to one rank. The measured figures are what
``t1ops/preflight/calibration.ACTIVATION_LAYOUT_POINTS`` records (docs/preflight.md).

Run: python bench/bench_activations.py [--layouts "1 rank" cp2 pp2 tp2-sp tp2-sp-cp2]
"""
from __future__ import annotations

import argparse

from t1ops.campaign.trainer_rank import measure_layouts
from t1ops.preflight.calibration import ACTIVATION_LONG_TOKENS as tokens
from t1ops.preflight.cpu_activations import LAYOUTS, model_bytes_per_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    args = ap.parse_args()
    names = ["1 rank"] + [n for n in args.layouts if n != "1 rank"]
    print("layout       per-rank peaks (bytes)              measured B/token/rank  model B/token/rank  "
          "measured 1-rank/layout  model 1-rank/layout", flush=True)
    base_m = base_p = 0.0
    for name in names:  # one layout at a time, each printed as it lands
        peaks = measure_layouts([name])[name]
        m, p = max(peaks) / tokens, model_bytes_per_token(*LAYOUTS[name])
        base_m, base_p = base_m or m, base_p or p
        print(f"{name:12s} {peaks!s:36s} {m:21.1f} {p:19.1f} {base_m / m:23.2f}x {base_p / p:19.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
