"""Benchmark: TITO assembly cost per turn, turn 1 vs turn 60, against a naive builder.

TITO (token-in mode): per turn, render the fixed base + this turn's tool
messages (the walkthrough's section 4.1 delta) and append ids, so the cost
should stay flat as history grows. The naive builder re-renders and
re-encodes the whole history every turn (what a text-persisting harness
does), so its per-turn cost grows with the turn index. Both use the real
Qwen3.5 tokenizer and are measured in the same run; the printed numbers
are ratios.

Run: python bench/bench_tito.py [--turns 60 --obs-words 55 --repeat 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

from rl.chat import IM_END_ID, ChatRenderer
from rl.tito import TitoBuilder

SYSTEM = [{"role": "system", "content": "You are a terminal agent."},
          {"role": "user", "content": "Make the failing tests pass."}]


def turn_content(t: int, obs_words: int) -> tuple[dict, dict]:
    call = {"function": {"name": "bash", "arguments": {"cmd": f"pytest -x tests/test_{t:03d}.py"}}}
    asst = {"role": "assistant", "content": f"Step {t:03d}: run the tests.", "tool_calls": [call]}
    tool = {"role": "tool", "content": " ".join(f"line{t:03d}_{i:03d} ok" for i in range(obs_words))}
    return asst, tool


def run_tito(r: ChatRenderer, turns: int, obs_words: int) -> list[float]:
    b = TitoBuilder(r.render_prompt(SYSTEM), sample_id="bench")
    times, prev_tool = [], None
    for t in range(turns):
        asst, tool = turn_content(t, obs_words)
        gen = r.encode(f"Step {t:03d}: run the tests.") + [IM_END_ID]  # what the engine sampled
        t0 = time.perf_counter()
        if prev_tool is not None:
            b.add_observation(r.observation_ids([prev_tool], IM_END_ID))
        b.add_generation(gen, [-0.1] * len(gen), policy_version=0)
        times.append(time.perf_counter() - t0)
        prev_tool = tool
    return times


def run_naive(r: ChatRenderer, turns: int, obs_words: int) -> list[float]:
    history, times = list(SYSTEM), []
    for t in range(turns):
        asst, tool = turn_content(t, obs_words)
        t0 = time.perf_counter()
        r.render_prompt(history)  # re-render + re-encode the whole history every turn
        times.append(time.perf_counter() - t0)
        history += [asst, tool]
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--obs-words", type=int, default=55)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    r = ChatRenderer.default()
    run_tito(r, 3, a.obs_words)  # warm-up: tokenizer caches, first allocations
    runs_tito = [run_tito(r, a.turns, a.obs_words) for _ in range(a.repeat)]
    runs_naive = [run_naive(r, a.turns, a.obs_words) for _ in range(a.repeat)]

    def at(runs, i):  # per turn: min over repeats (least disturbed); then median of 3 turns
        return statistics.median(min(run[j] for run in runs) for j in range(max(i - 1, 0), i + 2))

    first, last = 1, a.turns - 2
    tito_1, tito_n = at(runs_tito, first), at(runs_tito, last)
    naive_1, naive_n = at(runs_naive, first), at(runs_naive, last)
    num_tokens = len(r.render_prompt(SYSTEM + [m for t in range(a.turns) for m in turn_content(t, a.obs_words)]))
    print(f"{a.turns} turns, final history {num_tokens:,} tokens (real Qwen3.5 tokenizer)")
    print(f"TITO  per turn: turn {first + 1} {tito_1 * 1e3:7.2f} ms, turn {last + 1} {tito_n * 1e3:7.2f} ms"
          f"   late/early {tito_n / tito_1:5.2f}x")
    print(f"naive per turn: turn {first + 1} {naive_1 * 1e3:7.2f} ms, turn {last + 1} {naive_n * 1e3:7.2f} ms"
          f"   late/early {naive_n / naive_1:5.2f}x")
    print(f"naive / TITO at turn {last + 1}: {naive_n / tito_n:.1f}x")


if __name__ == "__main__":
    main()
