"""unbounded-http: a control-plane call to an engine that accepts and never answers.

T1 report, section 08: hardened "unbounded control-plane HTTP (bounded
timeouts, while bulk weight transfers deliberately stay unbounded)".

Fault: a real embedded engine process is SIGSTOPped. The kernel still
completes TCP handshakes on its listening socket (observed), so a client
connects, sends its request and waits for an answer that never comes.

- Unguarded: ``POST /pause_generation`` through a plain client without a
  timeout; an outer watchdog gives up after ``WATCHDOG_S`` so the scenario ends.
- Guarded: the same call through :class:`t1ops.guards.http.BoundedHttp` raises
  :class:`ControlPlaneTimeout` within its deadline, naming the attempts. A bulk
  ``/update_weights_from_disk`` sent meanwhile stays pending past that deadline
  (deliberately unbounded) and gets its answer once the engine continues.
"""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import psutil

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.procs import wait_stopped
from chaos.scenarios.dead_engine import engine_client, kill_all, spawn_engines
from t1ops.errors import ControlPlaneTimeout, T1OpsError
from t1ops.guards.http import BoundedHttp

WATCHDOG_S = 5.0   # bounds the unguarded attempt; it would otherwise wait forever


def _call_in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def target():
        try:
            box["result"] = fn()
        except Exception as err:  # recorded for the report
            box["error"] = err
        box["done_at"] = time.monotonic()
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def _accepts_connection(url: str) -> bool:
    host, port = httpx.URL(url).host, httpx.URL(url).port
    with socket.create_connection((host, port), timeout=2.0):
        return True


@register("unbounded-http", "a control-plane HTTP call to an engine that never answers")
def run(tmp: Path) -> Outcome:
    (proc,) = spawn_engines(tmp, 1)
    bounded = BoundedHttp(timeout_s=0.5, attempts=3, generate_timeout_s=5.0, backoff_s=0.1)
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        fault_fired = wait_stopped(proc.pid) and _accepts_connection(proc.url)
        state = psutil.Process(proc.pid).status()

        # Unguarded: no timeout; the watchdog observes the hang.
        plain = engine_client(proc.url, httpx.Client(timeout=None))
        t_bad, bad = _call_in_thread(plain.pause_generation)
        t_bad.join(WATCHDOG_S)
        hung = t_bad.is_alive()
        unguarded = (f"POST /pause_generation to a stopped engine: no timeout, no error, hung > {WATCHDOG_S:g} s"
                     if hung else f"returned without hanging: {bad}")

        # Guarded: bounded control call; a bulk transfer started alongside stays unbounded.
        client = engine_client(proc.url, bounded)
        t_bulk, bulk = _call_in_thread(lambda: client.update_weights_from_disk(str(tmp / "no-such-ckpt"), "1"))
        t0 = time.monotonic()
        try:
            client.pause_generation()
            caught, error = False, "pause_generation returned from a stopped engine"
        except ControlPlaneTimeout as err:
            caught, error = True, str(err)
        detection_s = time.monotonic() - t0
        tl = Timeline()  # from the control call to the stopped engine: it ends with the named error
        tl.fault(at=t0)
        if caught:
            tl.after_fault(detected=detection_s, stopped=detection_s)
        time.sleep(max(0.0, bounded.deadline_s + 1.0 - detection_s))
        bulk_pending_past_deadline = t_bulk.is_alive()

        os.kill(proc.pid, signal.SIGCONT)
        t_bulk.join(60)
        t_bad.join(60)
    finally:
        kill_all([proc])
    bulk_err = bulk.get("error")
    bulk_answered = isinstance(bulk_err, T1OpsError) and "refused" in str(bulk_err)  # the engine's own answer
    return Outcome(
        fault_fired=fault_fired, unguarded=unguarded,
        guarded=Guarded(caught=caught, detection_s=detection_s, error=error),
        invariants={
            "unguarded_call_hung": hung,
            "raised_within_deadline": caught and detection_s <= bounded.deadline_s + 0.5,
            "error_names_attempts": "3/3 attempts" in error,
            "bulk_transfer_not_cut_short": bulk_pending_past_deadline and bulk_answered,
            "unguarded_call_finished_after_continue": not t_bad.is_alive(),
        },
        details={"process_state_after_sigstop": state, "deadline_s": bounded.deadline_s,
                 "bulk_answer": str(bulk_err or bulk.get("result"))[:300],
                 "unguarded_after_continue": str(bad.get("error") or bad.get("result"))[:200]},
        recovery=tl.recovery(how="the call stopped with ControlPlaneTimeout; the run goes on: the pool counts "
                                 "the failure and recreates the engine (runbooks/dead-engine.md): not timed here"))
