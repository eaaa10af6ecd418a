"""swallowed-engine-death: the engine's background generation loop dies; the process lives on.

SkyRL issue #1691 (github.com/NovaSky-AI/SkyRL/pull/1691): an ``EngineDeadError`` raised inside
an ``asyncio.create_task`` that nobody awaited was swallowed; the training process hung
indefinitely with every GPU idle and no error anywhere.

Fault: real embedded engines started with ``--chaos --chaos-fail-batcher-after N``: after N
forwards, the batch scheduler's loop (the thread every ``/generate`` waits on, which nobody
joins) raises ``RuntimeError`` with requests in flight. The process stays alive and ``/health``
keeps answering: nothing outside the engine notices.

- Unguarded: ``--chaos-unsupervised`` runs that loop bare (as before the guard). The engine's
  in-flight requests never finish, ``/health`` and ``/health_generate`` answer 200, and the
  pool keeps the engine live: a silent hang.
- Guarded: the loop is supervised (:mod:`rl.engines.background`): its death marks the engine
  failed, every waiting request answers 503 naming the cause, health answers 503. The pool
  takes the engine out of rotation at the first 503, resubmits its requests to the other
  engine (every sample comes back), and recreates it at the next weight sync.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.scenarios.dead_engine import engine_client, kill_all, make_checkpoint, spawn_engines, tiny_spec
from rl.engines import protocol as P
from rl.engines.ports import free_port
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.slots import EngineHandle
from t1ops.engines.pool import EnginePool
from t1ops.guards.http import BoundedHttp

FAIL_AFTER = 3        # forwards before the loop raises: requests are mid-generation
NUM_SAMPLES = 4
NEW_TOKENS = 12
WATCHDOG_S = 4.0      # how long the unguarded rollout is given (it would wait generate_timeout_s)


def _cfg(num: int) -> EngineConfig:
    return EngineConfig(num_engines=num, health_interval_s=0.3, failure_threshold=2, warmup_grace_s=30.0,
                        request_timeout_s=2.0, request_attempts=2, retry_backoff_s=0.05, generate_timeout_s=60.0)


def _request(i: int) -> P.GenerateRequest:
    return P.GenerateRequest(input_ids=(5, 6, 7, i), sampling_params=P.SamplingParams(max_new_tokens=NEW_TOKENS),
                             rid=f"sample-{i}")


def _spawn_faulty(tmp: Path, name: str, *extra: str):
    from rl.engines.embedded_spawn import spawn
    return spawn(free_port(), tiny_spec(), log_path=tmp / f"{name}.log",
                 extra_args=["--chaos", "--chaos-fail-batcher-after", str(FAIL_AFTER), *extra])


def _unguarded(proc) -> dict:
    cfg = _cfg(1)
    client = engine_client(proc.url, BoundedHttp.from_config(cfg))
    pool = EnginePool(lambda slot: EngineHandle(url=proc.url, client=client, process=proc), cfg)
    ex = cf.ThreadPoolExecutor(NUM_SAMPLES)
    try:
        pool.start()
        pool.wait_until_live(timeout_s=60)
        futures = [ex.submit(pool.generate, _request(i)) for i in range(NUM_SAMPLES)]
        done, hung = cf.wait(futures, timeout=WATCHDOG_S)
        return {"finished": len(done), "hung": len(hung), "errors": [repr(f.exception())[:120] for f in done
                                                                      if f.exception() is not None],
                "health": client.health(), "health_generate": client.health_generate(), "live": pool.live_slots(),
                "alive": proc.poll() is None}
    finally:
        pool.close()  # kills the engine: the hung requests end with a transport error
        ex.shutdown(wait=False, cancel_futures=True)


def _guarded(procs, tmp: Path) -> dict:
    cfg = _cfg(2)
    http = BoundedHttp.from_config(cfg)
    queue = list(procs)
    pool = EnginePool(lambda slot: EngineHandle(url=(p := queue.pop(0)).url, client=engine_client(p.url, http),
                                                process=p), cfg)
    try:
        pool.start()
        pool.wait_until_live(timeout_s=60)
        victim = pool.slot(0)
        since = time.time()
        with cf.ThreadPoolExecutor(NUM_SAMPLES) as ex:
            results = list(ex.map(pool.generate, [_request(i) for i in range(NUM_SAMPLES)]))
        collected_s = time.time() - since
        dead = [e for e in telemetry.recent_events("engine.dead", since=since) if e.get("url") == victim.url]
        resubmitted = telemetry.recent_events("engine.request_resubmitted", since=since)
        report = pool.sync_weights(make_checkpoint(tmp, 1), "1")
        pool.wait_until_live(2, timeout_s=120)
        return {"results": results, "dead": dead[:1], "detect_s": dead[0]["time"] - since if dead else None,
                "resubmitted": len(resubmitted), "recreated": report.recreated_slots, "collected_s": collected_s,
                "victim_pid": victim.process.pid, "replacement_pid": pool.slot(0).process.pid,
                "replacement_version": pool.slot(0).client.weight_version()}
    finally:
        pool.close()


@register("swallowed-engine-death", "an engine's background generation loop dies and the process lives on")
def run(tmp: Path) -> Outcome:
    with cf.ThreadPoolExecutor(3) as ex:
        bare_f = ex.submit(_spawn_faulty, tmp, "unsupervised", "--chaos-unsupervised")
        victim_f = ex.submit(_spawn_faulty, tmp, "supervised")
        clean = spawn_engines(tmp, 2)  # the victim's peer, and the replacement at the next sync
        bare, victim = bare_f.result(), victim_f.result()
    try:
        bad = _unguarded(bare)
        good = _guarded([victim, *clean], tmp)
    finally:
        kill_all([bare, victim, *clean])
    raised = [(tmp / f"{n}.log").read_text(errors="replace").count("chaos: batch scheduler raised")
              for n in ("unsupervised", "supervised")]
    results, dead = good["results"], good["dead"]
    tl = Timeline()  # from the rollout's start (the victim's loop raises on its first batch)
    tl.fault(at=0.0)
    tl.after_fault(detected=good["detect_s"], healthy=good["collected_s"] if len(results) == NUM_SAMPLES else None)
    return Outcome(
        fault_fired=all(n >= 1 for n in raised),
        unguarded=(f"loop unsupervised: {bad['hung']}/{NUM_SAMPLES} requests still waiting after {WATCHDOG_S:g} s, "
                   f"no error; process alive={bad['alive']}, /health ok={bad['health']}, /health_generate "
                   f"ok={bad['health_generate']}, pool live={bad['live']}"),
        guarded=Guarded(caught=bool(dead), detection_s=good["detect_s"],
                        error=f"engine.dead: {dead[0]['reason'][:240]}" if dead else ""),
        invariants={
            "unguarded_requests_hung_silently": bad["hung"] > 0 and not bad["errors"] and bad["health"]
            and bad["health_generate"] and bad["live"] == [0] and bad["alive"],
            "no_sample_lost": len(results) == NUM_SAMPLES and all(len(r.output_ids) == NEW_TOKENS for r in results),
            "death_surfaced_not_swallowed": bool(dead) and "background loop" in dead[0]["reason"],
            "requests_resubmitted": good["resubmitted"] >= 1,
            "recreated_at_next_sync": good["recreated"] == (0,) and good["replacement_pid"] != good["victim_pid"]
            and good["replacement_version"] == "1",
        },
        details={"unguarded": bad, "guarded": {k: v for k, v in good.items() if k != "results"},
                 "loops_raised": raised},
        recovery=tl.recovery(how="in place: the death surfaced, requests resubmitted to the peer; recreated at "
                                 "the next sync"))
