"""engine-left-paused: an engine acknowledges the barrier's continue and stays paused.

AReaL issue #1160 (github.com/areal-project/AReaL/issues/1160, fixed in AReaL PR #1181,
github.com/areal-project/AReaL/pull/1181): the disk weight-update path paused the rollout
engine and never resumed it; every later rollout request waited forever and training hung
with no error.

Fault: a real embedded engine started with ``--chaos --chaos-drop-continue`` answers
``/continue_generation`` with success and stays paused: the continue is lost between the
barrier and the scheduler.

- Unguarded: the pool's barrier with ``engine.resume_probe = false``. The sync "succeeds",
  the gate opens, the engine is live in the pool, and a rollout request sent to it does not
  finish within the watchdog (it would wait for ``generate_timeout_s``, ten minutes by default).
- Guarded: ``resume_probe = true``. After the acknowledged continue, a one-token probe does not
  finish within ``resume_deadline_s`` (the continue is re-sent half-way); the engine is
  declared dead, killed and recreated before the gate opens, and the request is served by the
  replacement at the new version.
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

DEADLINE_S = 2.0   # resume_deadline_s, scaled down from production seconds
WATCHDOG_S = 4.0   # how long the unguarded request is given (production would wait generate_timeout_s)


def _cfg(probe: bool) -> EngineConfig:
    return EngineConfig(num_engines=1, health_interval_s=0.3, failure_threshold=2, warmup_grace_s=30.0,
                        request_timeout_s=2.0, request_attempts=2, retry_backoff_s=0.05, generate_timeout_s=60.0,
                        resume_probe=probe, resume_deadline_s=DEADLINE_S)


def _request(i: int) -> P.GenerateRequest:
    return P.GenerateRequest(input_ids=(5, 6, 7), sampling_params=P.SamplingParams(max_new_tokens=3), rid=f"rollout-{i}")


def _unguarded(proc, tmp: Path) -> dict:
    cfg = _cfg(probe=False)
    client = engine_client(proc.url, BoundedHttp.from_config(cfg))
    pool = EnginePool(lambda slot: EngineHandle(url=proc.url, client=client), cfg)  # not owned: reused below
    ex = cf.ThreadPoolExecutor(1)
    try:
        pool.start()
        pool.wait_until_live(timeout_s=60)
        report = pool.sync_weights(make_checkpoint(tmp, 1), "1")
        fut = ex.submit(pool.generate, _request(0))
        done, _ = cf.wait([fut], timeout=WATCHDOG_S)
        info = client.http.request("GET", proc.url + "/model_info").json()
        client.abort_request(abort_all=True)  # release the hung request (the watchdog's job here)
        return {"sync_live": list(report.live_slots), "finished": bool(done), "gate_open": pool.gate_open,
                "live": pool.live_slots(), "engine_paused": info.get("is_paused"),
                "in_flight": info.get("num_running_requests")}
    finally:
        pool.close()
        ex.shutdown(wait=False, cancel_futures=True)


def _guarded(procs, tmp: Path) -> dict:
    cfg = _cfg(probe=True)
    http = BoundedHttp.from_config(cfg)
    queue = list(procs)
    pool = EnginePool(lambda slot: EngineHandle(url=(p := queue.pop(0)).url, client=engine_client(p.url, http),
                                                process=p), cfg, version="1", checkpoint_dir=None)
    try:
        pool.start()
        pool.wait_until_live(timeout_s=60)
        victim = pool.slot(0)
        since = time.time()
        report = pool.sync_weights(make_checkpoint(tmp, 2), "2")
        not_resumed = telemetry.recent_events("engine.not_resumed", since=since)
        resp = pool.generate(_request(1))  # waits for the replacement's admission
        served_at = time.time()
        replacement = pool.slot(0)
        return {"recreated": report.recreated_slots, "not_resumed": not_resumed[:1],
                "detect_s": not_resumed[0]["detect_s"] if not_resumed else None,
                "victim_exit": victim.process.poll(), "replacement_pid": replacement.process.pid,
                "victim_pid": victim.process.pid, "served_version": resp.weight_version,
                "served_tokens": len(resp.output_ids),
                # the fault: the continue the engine dropped, detect_s before its engine.not_resumed event
                "served_s": served_at - (not_resumed[0]["time"] - not_resumed[0]["detect_s"]) if not_resumed else None}
    finally:
        pool.close()


@register("engine-left-paused", "an engine acknowledges the barrier's continue and stays paused")
def run(tmp: Path) -> Outcome:
    from rl.engines.embedded_spawn import spawn

    with cf.ThreadPoolExecutor(2) as ex:  # the faulty engine and a clean spare (the replacement)
        faulty_f = ex.submit(spawn, free_port(), tiny_spec(), log_path=tmp / "faulty.log",
                             extra_args=["--chaos", "--chaos-drop-continue"])
        spare = spawn_engines(tmp, 1)
        faulty = faulty_f.result()
    try:
        bad = _unguarded(faulty, tmp)
        good = _guarded([faulty, *spare], tmp)
    finally:
        kill_all([faulty, *spare])
    drops = (tmp / "faulty.log").read_text(errors="replace").count("continue_generation acknowledged and dropped")
    tl = Timeline()  # from the dropped continue
    tl.fault(at=0.0)
    tl.after_fault(detected=good["detect_s"], healthy=good["served_s"] if good["served_version"] == "2" else None)
    return Outcome(
        fault_fired=drops >= 2,
        unguarded=(f"resume probe off: the sync reported engine {bad['sync_live']} live and opened the gate, the "
                   f"engine stayed paused (is_paused={bad['engine_paused']}) and a rollout request did not finish "
                   f"in {WATCHDOG_S:g} s"),
        guarded=Guarded(caught=bool(good["not_resumed"]) and good["recreated"] == (0,),
                        detection_s=good["detect_s"],
                        error=f"engine.not_resumed: {good['not_resumed'][0]['reason']}" if good["not_resumed"] else ""),
        invariants={
            "unguarded_request_hung_on_a_paused_engine": not bad["finished"] and bad["engine_paused"] is True
            and bad["gate_open"] and bad["live"] == [0],
            "detected_within_the_deadline": good["detect_s"] is not None and good["detect_s"] <= DEADLINE_S + 1.0,
            "paused_engine_recreated": good["recreated"] == (0,) and good["replacement_pid"] != good["victim_pid"]
            and good["victim_exit"] is not None,
            "request_served_at_the_new_version": good["served_version"] == "2" and good["served_tokens"] == 3,
        },
        details={"unguarded": bad, "guarded": good, "continues_dropped": drops},
        recovery=tl.recovery(how="in place: the paused engine recreated; the next request served at the new version"))
