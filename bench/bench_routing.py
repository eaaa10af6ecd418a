"""Benchmark: decode + stitch + CP-slice the routing of one long trajectory.

Shape from the T1 report (section 05): 60 turns, ~33k tokens, 48 MoE layers,
top-8 -> 1536 bytes per token, about 48 MiB. Each turn's SGLang response
carries base64 int32 rows for the positions it has not routed before. The
time is printed as a ratio to a plain memory copy of the same bytes,
measured in the same run (so the number is machine-independent).

Run: python bench/bench_routing.py [--turns 60 --tokens 33000 --cp 2 --repeat 9]
"""
from __future__ import annotations

import argparse
import os
import base64
import time

import numpy as np

import pybase64

from rl.routing import (
    assert_row_count, cp_zigzag_slice, decode_routed_experts, encode_routed_experts, pad_to_multiple,
    stitch_rows, stitch_zigzag,
)


def payloads(num_turns: int, num_tokens: int, layers: int, topk: int, seed: int = 0):
    """Per-turn (start position, base64 rows) covering [0, num_tokens - 1)."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, (num_tokens - 1, layers, topk), dtype=np.int32)
    bounds = np.linspace(0, num_tokens - 1, num_turns + 1).astype(int)
    return rows, [(int(a), encode_routed_experts(rows[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]


def pipeline(segs, num_tokens: int, layers: int, topk: int, cp: int) -> list[np.ndarray]:
    """Decode, stitch into the CP zig-zag layout (one copy), fill the last token's row."""
    decoded = [(start, decode_routed_experts(b64, layers, topk)) for start, b64 in segs]
    rows = stitch_zigzag(decoded, num_tokens, cp)
    rows.fill_from_previous(np.flatnonzero(~rows.has_row_N))  # the last token: no gradient depends on it
    return rows.parts


def pipeline_stepwise(segs, num_tokens: int, layers: int, topk: int, cp: int) -> list[np.ndarray]:
    """The same result through separate stitch, pad and slice arrays (the reference)."""
    decoded = [(start, decode_routed_experts(b64, layers, topk)) for start, b64 in segs]
    rows, has = stitch_rows(decoded, num_tokens)
    rows[~has] = rows[np.flatnonzero(has)[-1]]
    assert_row_count(num_tokens, rows)
    padded = pad_to_multiple(rows, 2 * cp)
    return [cp_zigzag_slice(padded, cp, r) for r in range(cp)]


def timed_together(fns: dict, repeat: int) -> dict:
    """Best of ``repeat`` rounds per function, the functions interleaved round by round, so that
    load from elsewhere on a shared machine hits the baseline and the candidates alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=33_000)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=9)
    a = ap.parse_args()
    rows, segs = payloads(a.turns, a.tokens, a.layers, a.topk)
    nbytes = a.tokens * a.layers * a.topk * 4
    src = np.frombuffer(rows.tobytes() + bytes(a.layers * a.topk * 4), dtype=np.uint8)
    t = timed_together({
        "copy": lambda: src.copy(),
        "std": lambda: [base64.b64decode(b, validate=True) for _, b in segs],
        "b64": lambda: [pybase64.b64decode(b, validate=True) for _, b in segs],
        "step": lambda: pipeline_stepwise(segs, a.tokens, a.layers, a.topk, a.cp),
        "pipe": lambda: pipeline(segs, a.tokens, a.layers, a.topk, a.cp)}, a.repeat)
    t_copy, t_std, t_b64, t_step, t_pipe = t["copy"], t["std"], t["b64"], t["step"], t["pipe"]
    for mine, ref in zip(pipeline(segs, a.tokens, a.layers, a.topk, a.cp),
                         pipeline_stepwise(segs, a.tokens, a.layers, a.topk, a.cp)):
        assert np.array_equal(mine, ref), "one-copy stitch differs from stitch + pad + slice"
    print(f"load average {os.getloadavg()[0]:.1f}; best of {a.repeat} interleaved rounds")
    print(f"routing of {a.turns} turns x {a.tokens:,} tokens x {a.layers} layers x top-{a.topk}: "
          f"{nbytes / 2**20:.1f} MiB ({a.layers * a.topk * 4} bytes/token)")
    print(f"memcpy baseline        {t_copy * 1e3:8.2f} ms")
    print(f"stdlib base64 decode   {t_std * 1e3:8.2f} ms   ratio to memcpy: {t_std / t_copy:.1f}x")
    print(f"pybase64 decode alone  {t_b64 * 1e3:8.2f} ms   ratio to memcpy: {t_b64 / t_copy:.1f}x")
    print(f"same, separate arrays  {t_step * 1e3:8.2f} ms   ratio to memcpy: {t_step / t_copy:.1f}x  (stitch, then pad, then slice)")
    print(f"decode+stitch+CP({a.cp})   {t_pipe * 1e3:8.2f} ms   ratio to memcpy: {t_pipe / t_copy:.1f}x  (one copy; target <= 4x)")


if __name__ == "__main__":
    main()
