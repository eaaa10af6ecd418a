"""nonfinite-logprob: one non-finite sampled log-prob tears the whole run down.

SkyRL issue #1909 (github.com/NovaSky-AI/SkyRL/issues/1909): about once per 42 minutes at 192 GPUs the
inference engine sampled a token whose log-prob was ``-inf``; the response could not be serialised
(HTTP 400) and the error propagated up and ended the training run.

Fault (real): an in-process embedded engine behind its real HTTP server (``rl.engines.embedded_http``)
samples one token with log-prob ``-inf`` (the sampler's result replaced at its seam in the production
scheduler); the engine serialises it as JSON ``-Infinity``.

- Unguarded (the error propagated, as SkyRL did; in t1ops ``rollout.failed_trials = "abort"``): the
  worker's settlement of the group (``RolloutWorker._book``) re-raises it: the rollout, and the run,
  end on one sample.
- Guarded (the default ``rollout.failed_trials = "drop"``): the client's strict parse rejects the one
  response with a ``ParseError`` naming the token (never a NaN into the loss); the worker's
  settlement fails that trial alone, counted in the ledger with the reason; the group trains on the
  others and the engine keeps serving (the next request finishes). t1ops is immune by design.
"""
from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.scenarios.prefix_cache_across_versions import PROMPT, inproc_engine
from rl.engines import batching
from rl.engines import protocol as P
from rl.errors import ParseError

POISONED_CALL = 3


def _request(rid: str) -> P.GenerateRequest:
    return P.GenerateRequest(input_ids=PROMPT, rid=rid, return_logprob=True,
                             sampling_params=P.SamplingParams(max_new_tokens=6, temperature=1.0))


def _poisoned_sampler(counter: list):
    real = batching.sample_token

    def sample(logits, params, generator):
        token, logprob = real(logits, params, generator)
        counter[0] += 1
        return (token, float("-inf")) if counter[0] == POISONED_CALL else (token, logprob)
    return real, sample


def _settle(outcomes: list, policy: str) -> tuple[list, dict, Exception | None]:
    """The worker's settlement of one group (``RolloutWorker._book``) under ``rollout.failed_trials``."""
    from t1ops.campaign.trials import TrialSpec
    from t1ops.campaign.worker import RolloutWorker
    from t1ops.guards.pacing import SkimAccounting, TrialLedger
    specs = [TrialSpec(task="t", group_id="g", sample_idx=i) for i in range(len(outcomes))]
    ledger = TrialLedger()
    for s in specs:
        ledger.expect(f"{s.group_id}/{s.sample_idx}")
    worker = SimpleNamespace(settings=SimpleNamespace(rollout=SimpleNamespace(failed_trials=policy)),
                             tasks={"t": SimpleNamespace(family="f")}, ABORT_ON=RolloutWorker.ABORT_ON)
    try:
        kept = RolloutWorker._book(worker, outcomes, specs, ledger, SkimAccounting(), True)
        return kept, ledger.summary(), None
    except Exception as e:  # the rollout ends here
        return [], ledger.summary(), e


@register("nonfinite-logprob", "one non-finite sampled log-prob tears the whole run down")
def run(tmp: Path) -> Outcome:
    from chaos.scenarios.dead_engine import engine_client
    from rl.engines.embedded_http import make_handler
    from t1ops.config import EngineConfig
    from t1ops.guards.http import BoundedHttp

    engine = inproc_engine()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(engine))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    client = engine_client(url, BoundedHttp.from_config(EngineConfig(request_timeout_s=30.0)))
    counter = [0]
    real, poisoned = _poisoned_sampler(counter)
    batching.sample_token = poisoned
    tl = Timeline()
    try:
        tl.fault()
        try:
            client.generate(_request("poisoned"))
            err: Exception | None = None
        except ParseError as e:
            err = e
        tl.detected()
        healthy = client.generate(_request("next"))
        tl.healthy()
    finally:
        batching.sample_token = real
        server.shutdown()
        server.server_close()
        engine.close()
    outcomes = [err, healthy]
    _, _, abort_err = _settle(outcomes, "abort")
    kept, books, drop_err = _settle(outcomes, "drop")
    return Outcome(
        fault_fired=counter[0] >= POISONED_CALL and err is not None,
        unguarded=(f"the error propagated (rollout.failed_trials = abort, as SkyRL did): the group's settlement "
                   f"raised {type(abort_err).__name__}: the rollout and the run end on one sampled token"),
        guarded=Guarded(caught=isinstance(err, ParseError) and drop_err is None and len(kept) == 1,
                        detection_s=tl.since_fault("detected"),
                        error=f"{str(err)[:160]}; that trial failed (ledger {books}), the engine served the next "
                              f"request ({len(healthy.output_ids)} tokens)"),
        invariants={
            "unguarded_one_token_ends_the_rollout": isinstance(abort_err, ParseError),
            "strict_parse_names_the_non_finite_logprob": isinstance(err, ParseError) and "finite" in str(err),
            "guarded_only_that_trial_fails": drop_err is None and len(kept) == 1 and books["failed"] == 1
            and books["completed"] == 1,
            "engine_keeps_serving": len(healthy.output_ids) == 6 and not healthy.finish_reason.is_abort,
        },
        details={"ledger": books, "sampler_calls": counter[0]},
        recovery=tl.recovery(trials_lost=1, how="the trial dropped (rollout.failed_trials = drop), the run goes on"))
