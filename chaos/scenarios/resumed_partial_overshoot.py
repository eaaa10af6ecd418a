"""resumed-partial-overshoot: a resumed partial rollout overshoots its token budget.

verl issue #7207 (github.com/volcengine/verl/issues/7207) and slime issue #2261
(github.com/THUDM/slime/issues/2261): a rollout aborted for a weight sync was resumed by sending its
prompt plus the partial output with the original ``max_tokens``; the sample ended with 10,104
response tokens against an 8,192 cap, past what the trainer's buffers and the length statistics
assume.

Fault (real): an in-process embedded engine (production scheduler) is generating a 24-token
response when a weight sync pauses it, once with ``abort`` (one-step and sync modes), once
``in_place`` (fully async), after 8 tokens.

- Unguarded (the continuation as verl and slime did it): the aborted partial output is appended to
  the prompt and resubmitted with the original ``max_new_tokens``: the sample's response is
  8 + 24 = 32 tokens, over its 24-token budget.
- Guarded: abort mode goes through t1ops' request loop (``t1ops.engines.requests.generate``): an
  abort a barrier explains resubmits the *original* request (prompt, budget), the partial output is
  discarded, so the response is at most 24 tokens, all under one version; in-place mode keeps one
  request whose budget counts the tokens before and after the pause (24 tokens, two versions).
  t1ops is immune by design.
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.scenarios.prefix_cache_across_versions import PROMPT, inproc_engine, load, new_weights
from rl.engines import protocol as P
from t1ops.config import EngineConfig
from t1ops.engines import requests
from t1ops.engines.slots import Ticket

BUDGET, PAUSE_AT = 24, 8


def _request(ids, rid: str, budget: int = BUDGET) -> P.GenerateRequest:
    return P.GenerateRequest(input_ids=tuple(ids), rid=rid, return_logprob=True,
                             sampling_params=P.SamplingParams(max_new_tokens=budget, temperature=1.0, ignore_eos=True,
                                                              stop_token_ids=()))


class _OneEngine:
    """``requests.Traffic`` over one in-process engine: a barrier counter the sync bumps."""

    def __init__(self, engine) -> None:
        self.engine, self.num_syncs, self._ids = engine, 0, itertools.count()

    def admit(self, avoid, rid):
        return next(self._ids), Ticket(version=self.engine.weight_version, num_syncs=self.num_syncs, slot=0,
                                       client=self.engine)

    def call(self, t, request):
        return self.engine.generate(request)

    def release(self, ticket_id, t): pass
    def left_rotation(self, t): return ""
    def engine_failed(self, t, err, engine_reports_failed): pass
    def check_versions(self, t, resp): return None
    def syncs_since(self, t): return self.num_syncs - t.num_syncs
    def served(self, t, rid): pass
    def describe(self): return "one in-process engine"


def _sync_when(engine, after_tokens: int, mode: str, traffic: _OneEngine | None, tl: Timeline | None,
               version: str = "2") -> None:
    """A weight sync that pauses the engine once ``after_tokens`` tokens were generated."""
    state = new_weights(engine, seed=5)
    start = engine.num_generated_tokens
    while engine.num_generated_tokens - start < after_tokens:
        time.sleep(0.001)
    if traffic is not None:
        traffic.num_syncs += 1
    engine.pause(mode)
    if tl is not None:
        tl.fault()
    load(engine, state, version)
    engine.resume()


def _run(fn, *args):
    with cf.ThreadPoolExecutor(2) as ex:
        fut = ex.submit(fn)
        ex.submit(_sync_when, *args).result(timeout=60)
        return fut.result(timeout=60)


@register("resumed-partial-overshoot", "a rollout resumed after a weight sync overshoots its token budget")
def run(tmp: Path) -> Outcome:
    bad_engine = inproc_engine(max_batch=1)
    partial = _run(lambda: bad_engine.generate(_request(PROMPT, "r")), bad_engine, PAUSE_AT, "abort", None, None)
    continued = bad_engine.generate(_request(list(PROMPT) + list(partial.output_ids), "r-cont"))
    bad_total = len(partial.output_ids) + len(continued.output_ids)

    tl = Timeline()
    engine = inproc_engine(max_batch=1)
    traffic = _OneEngine(engine)
    cfg = EngineConfig(num_engines=1)
    with cf.ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        aborted = _run(lambda: requests.generate(traffic, cfg, pool, _request(PROMPT, "g")), engine, PAUSE_AT,
                       "abort", traffic, tl)
        abort_s = time.monotonic() - t0
    tl.detected()
    tl.healthy()
    in_place = _run(lambda: engine.generate(_request(PROMPT, "p")), engine, PAUSE_AT, "in_place", None, None, "3")
    spans = [(s.version, s.end - s.start) for s in in_place.weight_versions]
    bad_engine.close()
    engine.close()
    return Outcome(
        fault_fired=partial.finish_reason.is_abort and 0 < len(partial.output_ids) < BUDGET,
        unguarded=(f"aborted after {len(partial.output_ids)} tokens, continued with prompt + partial and the "
                   f"original max_new_tokens {BUDGET}: {bad_total} response tokens against a {BUDGET}-token budget"),
        guarded=Guarded(caught=len(aborted.output_ids) <= BUDGET and len(in_place.output_ids) <= BUDGET,
                        detection_s=abort_s,
                        error=f"abort: the original request resubmitted, {len(aborted.output_ids)} tokens at version "
                              f"{aborted.weight_version}; in place: {len(in_place.output_ids)} tokens, spans {spans}"),
        invariants={
            "unguarded_response_over_its_budget": bad_total > BUDGET,
            "guarded_abort_resubmits_the_original_request": len(aborted.output_ids) == BUDGET
            and [s.version for s in aborted.weight_versions] == ["2"],
            "guarded_in_place_keeps_one_budget_across_the_pause": len(in_place.output_ids) == BUDGET
            and len(spans) == 2 and sum(n for _, n in spans) == BUDGET,
        },
        details={"unguarded_partial": len(partial.output_ids), "unguarded_total": bad_total,
                 "guarded_abort_tokens": len(aborted.output_ids), "in_place_spans": spans},
        recovery=tl.recovery(how="the aborted request resubmitted whole after the barrier (partial discarded)"))
