"""version-read-twice: tokens labelled with a weight version that did not generate them.

AReaL issue #1569 (github.com/inclusionAI/AReaL/issues/1569): the weight version was read twice per
request, once while the tokens were sampled and once when the response was built; a weight update
between the two labelled the tokens with the newer version, and the trainer computed the wrong
staleness and importance weights for them.

Fault (real): an in-process embedded engine (production scheduler) samples every token of a request
under version 1; a weight update to version 2 (the distributed update's load step) lands between
the scheduler handing back the finished generation and the engine building the response (the thread
interleaving is forced at that seam). The engine's response carries ``weight_version`` "2" (read at
response time) and its per-token spans say "1" (recorded with each token under the model lock).

- Unguarded (the turn labelled from the response's version, as the agent loop did): the trajectory's
  tokens carry version 2.
- Guarded: ``rl.agent.response.policy_version`` labels from the per-token spans; the tokens carry
  version 1, the version that sampled them.
"""
from __future__ import annotations

import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.scenarios.prefix_cache_across_versions import PROMPT, greedy, inproc_engine, load, new_weights
from rl.agent.response import policy_version


def _serve_with_sync_after_sampling(tl: Timeline) -> tuple:
    engine = inproc_engine()
    state = new_weights(engine, seed=2)
    run = engine.scheduler.run

    def sync_lands_after_the_last_token(seq):
        gen = run(seq)                # every token sampled (and its version recorded) under version 1
        load(engine, state, "2")     # the weight sync lands before the response reads the version
        tl.fault()
        return gen

    engine.scheduler.run = sync_lands_after_the_last_token
    try:
        resp = greedy(engine, PROMPT, "turn")
    finally:
        engine.close()
    return resp, [s.version for s in resp.weight_versions]


@register("version-read-twice", "tokens labelled with a weight version that did not generate them")
def run(tmp: Path) -> Outcome:
    tl = Timeline()
    resp, spans = _serve_with_sync_after_sampling(tl)
    unguarded_label = int(resp.weight_version)  # the response-time read (the label as it was)
    t0 = time.monotonic()
    label = policy_version(resp)
    tl.detected()
    tl.healthy()
    return Outcome(
        fault_fired=resp.weight_version == "2" and spans == ["1"],
        unguarded=(f"a weight sync landed after the last token: the response says version {resp.weight_version!r}, "
                   f"its tokens were sampled by {spans}; labelled from the response, the turn's "
                   f"{len(resp.output_ids)} tokens carry version {unguarded_label}"),
        guarded=Guarded(caught=label == 1, detection_s=time.monotonic() - t0,
                        error=f"policy_version from the per-token spans: version {label} (the response said "
                              f"{resp.weight_version!r})"),
        invariants={
            "unguarded_tokens_labelled_with_the_newer_version": unguarded_label == 2 and spans == ["1"],
            "guarded_tokens_labelled_with_the_sampling_version": label == 1,
        },
        details={"response_version": resp.weight_version, "spans": spans, "tokens": len(resp.output_ids)},
        recovery=tl.recovery(how="in place: the label comes from the token record"))
