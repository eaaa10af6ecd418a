"""fd-exhaustion: a full fd table drops result deliveries; collection sits at 0/16.

Fault (real): a child "coordinator" process starts with its soft RLIMIT_NOFILE
lowered to 64 (the report: 1024, with 320 concurrent trials). It runs 16
concurrent trials; each holds sandbox connections (sockets) until its result
is acknowledged, and delivers its result through a new pipe. With the table
full, ``os.pipe()`` fails with EMFILE and the delivery layer drops the result
without a word, as the raylet did: "collected 0/16, completed=0" forever.

Guard (``t1ops.guards.fds``): ``FdGuard.start()`` raises the soft limit to the
hard limit, so all 16 arrive; where the hard limit is also low (a container
cap), ``StallDetector`` raises ``StallError`` after ``stall_timeout_s`` (1 s
here, 300 s by default) naming fd usage at the limit and the lost deliveries.
"""
from __future__ import annotations

import errno
import json
import os
import queue
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, register

NUM_TRIALS = 16            # the report's "collected 0/16"
SOFT_LIMIT = 64            # scaled from the report's 1024
CONNECTIONS_PER_TRIAL = 4  # 16 x 4 = 64: the table is full while trials wait for their ack
STALL_THRESHOLD_S = 1.0    # scaled from GuardsConfig.stall_timeout_s = 300 s
PATIENCE_S = 2.5           # how long the unguarded collector is watched
REPO = Path(__file__).resolve().parents[2]


def _trial(i: int, started: threading.Barrier, acks: dict, stats: dict, deliveries: queue.Queue,
           lock: threading.Lock) -> None:
    conns = []
    for _ in range(CONNECTIONS_PER_TRIAL):  # sandbox connections, held until the result is acked
        try:
            conns.append(socket.socket())
        except OSError:
            break
    started.wait()
    with lock:
        stats["sent"] += 1
    try:
        r, w = os.pipe()  # the result delivery needs fds of its own
        os.write(w, json.dumps({"trial": i, "reward": 1.0}).encode())
        os.close(w)
        deliveries.put((i, r))
    except OSError as err:  # the raylet's behaviour: the delivery is dropped, nobody is told
        with lock:
            stats["dropped"] += err.errno == errno.EMFILE
    acks[i].wait()
    for c in conns:
        c.close()


def _collect(cfg: dict) -> dict:
    """The child coordinator: launch trials, collect results, optionally guarded."""
    from t1ops.errors import StallError
    from t1ops.guards.fds import FdGuard, StallDetector

    if cfg["guarded"]:
        FdGuard(warn_fraction=0.8).start()  # raises soft to hard
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    stats, lock, deliveries = {"sent": 0, "dropped": 0}, threading.Lock(), queue.Queue()
    acks = {i: threading.Event() for i in range(NUM_TRIALS)}
    started = threading.Barrier(NUM_TRIALS)
    detector = StallDetector(STALL_THRESHOLD_S, fd_guard=FdGuard(warn_fraction=0.8),
                             num_sent=lambda: stats["sent"]) if cfg["guarded"] else None
    threads = [threading.Thread(target=_trial, args=(i, started, acks, stats, deliveries, lock), daemon=True)
               for i in range(NUM_TRIALS)]
    for t in threads:
        t.start()
    if detector:
        detector.on_submit(NUM_TRIALS)
    t0, collected, log, error, detection_s = time.monotonic(), 0, [], None, None
    while collected < NUM_TRIALS and time.monotonic() - t0 < PATIENCE_S:
        while not deliveries.empty():
            i, r = deliveries.get()
            json.loads(os.read(r, 4096))
            os.close(r)
            collected += 1
            acks[i].set()
            if detector:
                detector.on_complete()
        log.append(f"collected {collected}/{NUM_TRIALS}, completed={collected}")
        if detector:
            try:
                detector.check()
            except StallError as err:
                error, detection_s = str(err), time.monotonic() - t0
                break
        time.sleep(0.05)
    for ev in acks.values():  # tear the trials down
        ev.set()
    for t in threads:
        t.join(timeout=5)
    return {"soft": soft, "hard": hard, "collected": collected, "sent": stats["sent"], "dropped": stats["dropped"],
            "error": error, "detection_s": detection_s, "log_tail": log[-1] if log else ""}


def _spawn(guarded: bool, hard: int | None) -> dict:
    """Run the coordinator in a real child whose soft (and maybe hard) nofile is lowered."""
    def lower() -> None:
        _, cur_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_LIMIT, hard if hard is not None else cur_hard))

    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    res = subprocess.run([sys.executable, "-m", "chaos.scenarios.fd_exhaustion", json.dumps({"guarded": guarded})],
                         capture_output=True, text=True, timeout=120, preexec_fn=lower, cwd=REPO, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"fd-exhaustion child failed (rc {res.returncode}): {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


@register("fd-exhaustion", "a full fd table silently drops result deliveries; collection stalls at 0/16")
def run(tmp: Path) -> Outcome:
    unguarded = _spawn(guarded=False, hard=None)
    raised = _spawn(guarded=True, hard=None)
    capped = _spawn(guarded=True, hard=SOFT_LIMIT)  # soft cannot be raised: the stall must be named
    fault_fired = unguarded["soft"] == SOFT_LIMIT and unguarded["dropped"] > 0 and unguarded["collected"] < NUM_TRIALS
    error = capped["error"] or ""
    caught = raised["collected"] == NUM_TRIALS and "fd usage near the soft nofile limit" in error
    return Outcome(
        fault_fired=fault_fired,
        unguarded=(f"after {PATIENCE_S:g} s: '{unguarded['log_tail']}', no exception "
                   f"({unguarded['dropped']} deliveries dropped with EMFILE at soft nofile {unguarded['soft']})"),
        guarded=Guarded(caught=caught, detection_s=capped["detection_s"], error=error),
        invariants={
            "raised limit collects every result": raised["collected"] == NUM_TRIALS and raised["soft"] == raised["hard"],
            "capped limit: stall named within threshold + 1 s": capped["detection_s"] is not None
            and capped["detection_s"] <= STALL_THRESHOLD_S + 1.0,
            "stall names the lost deliveries": "lost deliveries" in error,
            "unguarded run raised nothing (the silent failure)": unguarded["error"] is None,
        },
        details={"unguarded": unguarded, "guarded_raised": raised, "guarded_capped": capped,
                 "stall_threshold_s": STALL_THRESHOLD_S, "scaled_from": "soft nofile 1024, stall_timeout_s 300"},
    )


if __name__ == "__main__":
    print(json.dumps(_collect(json.loads(sys.argv[1]))))
