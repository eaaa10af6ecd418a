"""missing-routing: an engine answers one trial without routed experts.

Fault (real): the rollout talks to an SGLang-compatible engine through the
real ``rl.engines.client.EngineClient`` over an injected HTTP transport. A
transport in front of the engine strips ``meta_info.routed_experts`` from the
second-turn response of one trial, the longest one (large captures are the
ones that fail in practice). The scenario observes the stripped response.

Unguarded: a naive collector treats the failed trial like any failed sample
and keeps the rest; the batch silently shrinks 8 -> 7 and, because the
dropped trial is the long failing one, its mean reward moves (dropping
conditions the batch on "capture succeeded": T1 report, section 05).
Guarded: absent routing raises ``MissingRoutingError`` (in the response
parser, and in ``TitoBuilder`` for any path that bypasses it); the rollout
aborts naming the trial; the ledger shows no sample vanished.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import numpy as np

from chaos.harness import Guarded, Outcome, register
from rl.chat import IM_END_ID, ChatRenderer
from rl.engines.client import EngineClient
from rl.engines.protocol import FinishReason, GenerateRequest, GenerateResponse, SamplingParams
from rl.errors import T1OpsError
from rl.routing import assert_row_count
from rl.tito import TitoBuilder
from t1ops.errors import MissingRoutingError
from t1ops.guards.pacing import TrialLedger

NUM_LAYERS, TOPK, NUM_EXPERTS = 4, 2, 16
NUM_TRIALS, NUM_TURNS = 8, 2
FAULTY = "trial-5"                      # the longest trial; its reward is 0
REWARDS = {f"trial-{i}": float(i % 2 == 0) for i in range(NUM_TRIALS)}  # mean 0.5


def _engine(renderer: ChatRenderer):
    """An SGLang-compatible /generate: deterministic outputs, routing for [start, seqlen-1)."""

    def handle(request: httpx.Request) -> httpx.Response:
        req = GenerateRequest.from_json(json.loads(request.content))
        trial = req.rid.rsplit("-t", 1)[0]
        words = 40 if trial == FAULTY else 6
        out = renderer.encode(" ".join(["step"] * words)) + [IM_END_ID]
        seq = np.asarray(list(req.input_ids) + out, dtype=np.int64)
        rows = (seq[req.routed_experts_start_len:-1, None, None] + np.arange(NUM_LAYERS)[:, None]
                + np.arange(TOPK)) % NUM_EXPERTS
        resp = GenerateResponse(
            output_ids=tuple(out), finish_reason=FinishReason("stop", matched=IM_END_ID),
            weight_version="7", prompt_tokens=len(req.input_ids), completion_tokens=len(out),
            rid=req.rid, output_token_logprobs=tuple([-0.1] * len(out)),
            routed_experts_RLK=rows.astype(np.int32) if req.return_routed_experts else None)
        return httpx.Response(200, json=resp.to_json())

    return handle


class _StripRouting:
    """The fault: drop meta_info.routed_experts from one trial's second-turn answer."""

    def __init__(self, inner) -> None:
        self.inner, self.stripped = inner, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        resp = self.inner(request)
        body = resp.json()
        rid = body["meta_info"]["id"]
        if rid == f"{FAULTY}-t1" and body["meta_info"].pop("routed_experts", None) is not None:
            self.stripped.append(rid)
        return httpx.Response(resp.status_code, json=body)


def _trial(client: EngineClient, renderer: ChatRenderer, trial: str):
    prompt = renderer.render_prompt([{"role": "user", "content": f"task for {trial}"}])
    b = TitoBuilder(prompt, sample_id=trial, num_layers=NUM_LAYERS, topk=TOPK)
    routed_upto = 0
    for turn in range(NUM_TURNS):
        if turn:
            b.add_observation(renderer.observation_ids([{"role": "tool", "content": "ok"}], IM_END_ID))
        req = GenerateRequest(input_ids=tuple(b.tokens), rid=f"{trial}-t{turn}",
                              sampling_params=SamplingParams(max_new_tokens=64),
                              return_logprob=True, return_routed_experts=True,
                              routed_experts_start_len=routed_upto)
        resp = client.generate(req)
        b.add_generation(resp.output_ids, resp.output_token_logprobs, policy_version=7,
                         routing_rows=resp.routed_experts_RLK, routing_start=routed_upto)
        routed_upto = len(b.tokens) - 1
    [traj] = b.finish()
    assert_row_count(len(traj), traj.routing, sample=trial)
    return traj


def _rollout(client, renderer, guarded: bool) -> tuple[list, TrialLedger]:
    ledger, kept = TrialLedger(name="rollout"), []
    trials = [f"trial-{i}" for i in range(NUM_TRIALS)]
    for t in trials:
        ledger.expect(t)
    for t in trials:
        try:
            kept.append(_trial(client, renderer, t))
            ledger.complete(t)
        except MissingRoutingError as err:
            if guarded:  # the rule: abort the rollout, never drop the sample
                ledger.fail(t, err)
                raise
        except T1OpsError as err:
            ledger.fail(t, err)
    return kept, ledger


@register("missing-routing", "an engine returns no routing for one trial: abort, never drop the sample")
def run(tmp: Path) -> Outcome:
    renderer = ChatRenderer.default()
    fault = _StripRouting(_engine(renderer))
    client = EngineClient("http://engine", httpx.Client(transport=httpx.MockTransport(fault)),
                          num_moe_layers=NUM_LAYERS, topk=TOPK, num_experts=NUM_EXPERTS)

    kept, _ = _rollout(client, renderer, guarded=False)
    ids = [t.meta["sample_id"] for t in kept]
    mean_all = float(np.mean(list(REWARDS.values())))
    mean_kept = float(np.mean([REWARDS[i] for i in ids]))
    unguarded = (f"batch silently shrank to {len(kept)}/{NUM_TRIALS} samples ({FAULTY} dropped, no error); "
                 f"mean reward {mean_kept:.3f} instead of {mean_all:.3f}")
    stripped_unguarded = len(fault.stripped)

    t0, err, ledger = time.monotonic(), None, None
    try:
        _, ledger = _rollout(client, renderer, guarded=True)
    except MissingRoutingError as e:
        err = e
    detection_s = time.monotonic() - t0 if err else None

    # second layer: a path that skips the parser check still cannot build the sample
    try:
        TitoBuilder([1, 2], sample_id=FAULTY, num_layers=NUM_LAYERS, topk=TOPK).add_generation(
            [3, IM_END_ID], [-0.1, -0.1], policy_version=7, routing_rows=None)
        builder_err = ""
    except MissingRoutingError as e:
        builder_err = str(e)
    return Outcome(
        fault_fired=stripped_unguarded > 0 and len(fault.stripped) > stripped_unguarded,
        unguarded=unguarded,
        guarded=Guarded(caught=err is not None, detection_s=detection_s, error=str(err or "")),
        invariants={
            "unguarded_batch_shrank_silently": len(kept) == NUM_TRIALS - 1 and FAULTY not in ids,
            "rollout_aborted_not_shrunk": err is not None and ledger is None,
            "error_names_the_trial": err is not None and FAULTY in str(err),
            "builder_refuses_absent_routing": FAULTY in builder_err,
            "healthy_rows_match_tokens": all(t.routing.shape[0] == len(t) for t in kept),
        },
        details={"stripped_responses": fault.stripped, "unguarded_kept": ids,
                 "mean_reward_all": mean_all, "mean_reward_kept": mean_kept,
                 "builder_error": builder_err})
