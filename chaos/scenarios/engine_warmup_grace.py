"""engine-warmup-grace: an engine frozen in its first compile must not be killed.

T1 report, section 08 hardens dead engines with health pings; the issue adds
the warm-up grace because another framework killed engines that missed one
ping while compiling. Compiles can be long (report, section 09: a cold JIT ran
> 30 minutes on one rank).

Fault: right after a real embedded engine starts, it is frozen (SIGSTOP) for
``FREEZE_S``, several ping intervals, as a first compile would block it; then
it is thawed (SIGCONT).

- Unguarded: :class:`EnginePool` with ``warmup_grace_s = 0``: the missed pings
  count, the threshold is reached, and the pool kills a healthy engine.
- Guarded: the same pool with a grace longer than the freeze: each miss is an
  ``engine.ping_missed_in_grace`` event, the engine is admitted once it thaws
  and serves a request.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.procs import wait_stopped
from chaos.scenarios.dead_engine import kill_all, prestarted_factory, spawn_engines
from rl.engines import protocol as P
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.pool import EnginePool
from t1ops.errors import EngineDeadError
from t1ops.guards.http import BoundedHttp

PING_S = 0.3
THRESHOLD = 2
FREEZE_S = 8 * PING_S   # several ping intervals: more misses than the threshold
GRACE_S = 30.0
KILL_WAIT_S = 30.0  # the unguarded pool kills within ~THRESHOLD pings; this bounds a loaded host


def _phase(proc, tmp: Path, grace_s: float) -> dict:
    cfg = EngineConfig(num_engines=1, health_interval_s=PING_S, failure_threshold=THRESHOLD, warmup_grace_s=grace_s,
                       request_timeout_s=0.3, request_attempts=1, retry_backoff_s=0.0, generate_timeout_s=60.0)
    pool = EnginePool(prestarted_factory([proc], BoundedHttp.from_config(cfg), tmp), cfg)
    since = time.time()
    try:
        os.kill(proc.pid, signal.SIGSTOP)  # frozen as in a first compile, before the pool's first ping
        frozen = wait_stopped(proc.pid)
        pool.start()
        # the guarded pool is looked at after FREEZE_S; the unguarded one until it kills (a loaded host
        # can start its pinger late), at most KILL_WAIT_S: either way the engine is still frozen then
        t0 = time.monotonic()
        while True:
            time.sleep(PING_S)
            status_frozen, elapsed = pool.slot_state(0)[0], time.monotonic() - t0
            if elapsed >= FREEZE_S and (grace_s > 0 or status_frozen == "dead" or elapsed >= KILL_WAIT_S):
                break
        if proc.poll() is None:  # the unguarded pool may already have killed and reaped it
            os.kill(proc.pid, signal.SIGCONT)
        thawed_at = time.monotonic()
        admitted_s, served = None, False
        if status_frozen != "dead":
            try:
                pool.wait_until_live(timeout_s=60)
            except EngineDeadError:  # killed after the thaw: not admitted, and the outcome says so
                pass
            else:
                admitted_s = time.monotonic() - thawed_at
                req = P.GenerateRequest(input_ids=(5, 6, 7), sampling_params=P.SamplingParams(max_new_tokens=3))
                served = len(pool.generate(req).output_ids) == 3
        served_s = time.time() - since if served else None
        misses = telemetry.recent_events("engine.ping_missed_in_grace", since=since)
        dead = [e for e in telemetry.recent_events("engine.dead", since=since) if e.get("url") == proc.url]
        return {"frozen": frozen, "status_after_freeze": status_frozen, "killed": proc.poll() == -signal.SIGKILL,
                "dead_reason": dead[-1]["reason"] if dead else "", "dead_age_s": dead[-1]["age_s"] if dead else None,
                "misses_in_grace": len(misses), "first_miss_s": misses[0]["time"] - since if misses else None,
                "admitted_after_thaw_s": admitted_s, "served": served, "served_s": served_s}
    finally:
        pool.close()


@register("engine-warmup-grace", "an engine frozen in its first compile is killed by health pings")
def run(tmp: Path) -> Outcome:
    procs = spawn_engines(tmp, 2)
    try:
        bad = _phase(procs[0], tmp, grace_s=0.0)
        good = _phase(procs[1], tmp, grace_s=GRACE_S)
    finally:
        kill_all(procs)
    fault_fired = bad["frozen"] and good["frozen"]
    unguarded = (f"no warm-up grace: a healthy engine frozen {FREEZE_S:g} s in its first compile was killed "
                 f"({bad['dead_reason']}, age {bad['dead_age_s']} s)" if bad["killed"]
                 else f"no warm-up grace, engine survived the freeze ({bad['status_after_freeze']})")
    caught = good["status_after_freeze"] == "starting" and good["served"]
    tl = Timeline()  # from the freeze (SIGSTOP); detected: the first miss held in grace; healthy: served after thaw
    tl.fault(at=0.0)
    tl.after_fault(detected=good["first_miss_s"], healthy=good["served_s"])
    return Outcome(
        fault_fired=fault_fired, unguarded=unguarded,
        guarded=Guarded(caught=caught, detection_s=good["admitted_after_thaw_s"],
                        error=f"{good['misses_in_grace']} missed pings logged as engine.ping_missed_in_grace "
                              f"(grace {GRACE_S:g} s); engine admitted after thaw and served a request"),
        invariants={"no_false_kill": not good["killed"],
                    "misses_were_observed": good["misses_in_grace"] >= THRESHOLD,
                    "unguarded_false_kill_reproduced": bad["killed"]},
        details={"unguarded": bad, "guarded": good},
        recovery=tl.recovery(how=f"in place: no kill in the grace; served once the {FREEZE_S:g} s freeze ended"))
