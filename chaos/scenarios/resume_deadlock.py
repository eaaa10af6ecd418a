"""resume-deadlock: on resume, paused inference waits for the weights while the trainer waits for batches.

prime-rl PR #3004 (github.com/PrimeIntellect-ai/prime-rl/pull/3004): a GLM run resumed from a
checkpoint hung: the inference side was paused until the checkpoint's weights arrived, and the
trainer, before it would broadcast them, waited for the first batch of rollouts. No error, no
timeout.

Fault (real): a resume with the engine pool's barrier opened for the checkpoint's version (gate
closed, the engine paused: "waiting for the weights") while the first rollout of the resumed run is
requested; the production ``EnginePool`` and its request loop on a real embedded engine behind its
HTTP server.

- Unguarded (prime-rl's order: the trainer waits for the batch before it pushes the weights): the
  rollout waits at the closed gate, the weights wait for the rollout; after the watchdog (4 s) neither
  has moved.
- Guarded: t1ops' resume order (``t1ops/campaign/launch.py``): the trainer loads the checkpoint, then
  ``engine_barrier(router, resume_from, checkpoint)`` pushes it and reopens the gate, and only then
  does the step loop ask for rollouts: the first request is served at the checkpoint's version. And
  a request that ever waits at a closed gate waits ``engine.generate_timeout_s`` at most, then fails
  naming the closed gate (``EngineDeadError: no live engine for ... (gate closed)``): a bounded
  error, never a silent hang (t1ops is immune by design).
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import torch

from chaos.harness import Guarded, Outcome, Timeline, register
from rl.engines import protocol as P
from t1ops.errors import EngineDeadError

WATCHDOG_S = 4.0
GATE_WAIT_S = 2.0   # engine.generate_timeout_s, scaled down from 600 s


def http_engine():
    """An embedded engine (the scenario engines' spec) behind its real HTTP server, in this process."""
    from chaos.scenarios.dead_engine import tiny_spec
    from rl.engines.embedded_engine import EmbeddedEngine
    from rl.engines.embedded_http import make_handler
    from rl.megatron_cpu import init_single_process
    from rl.vocab import CompactVocab
    init_single_process()
    spec = tiny_spec()
    engine = EmbeddedEngine(spec, CompactVocab.identity(spec.vocab_size), torch.float32, 3, weight_version="0")
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(engine))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return engine, server, f"http://127.0.0.1:{server.server_address[1]}"


def _pool(url: str, gate_wait_s: float):
    from chaos.scenarios.dead_engine import engine_client
    from t1ops.config import EngineConfig
    from t1ops.engines.pool import EnginePool
    from t1ops.engines.slots import EngineHandle
    from t1ops.guards.http import BoundedHttp
    cfg = EngineConfig(num_engines=1, health_interval_s=0.3, failure_threshold=3, warmup_grace_s=30.0,
                       request_timeout_s=5.0, generate_timeout_s=gate_wait_s, resume_deadline_s=10.0)
    pool = EnginePool(lambda slot: EngineHandle(url=url, client=engine_client(url, BoundedHttp.from_config(cfg))),
                      cfg, version="0")
    pool.start()
    pool.wait_until_live(timeout_s=60)
    return pool


def _rollout(pool, rid: str):
    return pool.generate(P.GenerateRequest(input_ids=(5, 6, 7), rid=rid,
                                           sampling_params=P.SamplingParams(max_new_tokens=3)))


@register("resume-deadlock", "on resume, paused inference waits for weights while the trainer waits for batches")
def run(tmp: Path) -> Outcome:
    from chaos.scenarios.dead_engine import make_checkpoint

    ckpt = make_checkpoint(tmp, 4)   # the resume point: step 4
    engine, server, url = http_engine()
    ex = cf.ThreadPoolExecutor(2)
    try:
        # unguarded: the barrier is open for the checkpoint, the trainer waits for the batch first
        bad = _pool(url, gate_wait_s=60.0)
        bad.open_sync(ckpt, "4")
        rollout = ex.submit(_rollout, bad, "first-rollout")
        done, _ = cf.wait([rollout], timeout=WATCHDOG_S)
        bad_hung = not done and not bad.gate_open
        bad.abort_sync("scenario watchdog: the deadlock is observed")
        try:
            rollout.result(timeout=30)
        except Exception:
            pass
        bad.close()

        # guarded (a): a request at a closed gate fails within generate_timeout_s, naming the gate
        tl = Timeline()
        probe = _pool(url, gate_wait_s=GATE_WAIT_S)
        probe.open_sync(ckpt, "4")
        tl.fault()
        try:
            _rollout(probe, "waits-at-the-gate")
            err = None
        except EngineDeadError as e:
            err = e
        tl.detected()
        probe.abort_sync("scenario: the bounded wait is observed")
        probe.close()

        # guarded (b): t1ops' resume order: the checkpoint's weights pushed, the gate open, then rollouts
        good = _pool(url, gate_wait_s=GATE_WAIT_S)
        report = good.sync_weights(ckpt, "4")
        served = _rollout(good, "first-rollout-resumed")
        tl.healthy()
        good.close()
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
        server.shutdown()
        server.server_close()
        engine.close()
    return Outcome(
        fault_fired=bad_hung,
        unguarded=(f"barrier open for the checkpoint (gate closed, engine paused) while the trainer waits for the "
                   f"first batch: after {WATCHDOG_S:g} s neither the rollout nor the weight push has moved, no error"),
        guarded=Guarded(caught=isinstance(err, EngineDeadError) and served.weight_version == "4",
                        detection_s=tl.since_fault("detected"),
                        error=f"{str(err)[:200] if err else 'no error'}; in t1ops' order the first rollout is served "
                              f"at version {served.weight_version}"),
        invariants={
            "unguarded_rollout_and_weights_wait_on_each_other": bad_hung,
            "a_wait_at_a_closed_gate_is_bounded_and_named": isinstance(err, EngineDeadError) and "gate closed" in str(err)
            and (tl.since_fault("detected") or 99) < GATE_WAIT_S + 3,
            "resume_order_serves_the_checkpoint_version": served.weight_version == "4" and report.live_slots == (0,),
        },
        details={"sync_live": list(report.live_slots)},
        recovery=tl.recovery(how="weights pushed before the first rollout (the resume's barrier)"))
