"""jit-as-deadlock: a rank cold-compiling while its peers wait looks like a hang.

Fault (real), part 1: four rank threads meet in a ``threading.Barrier`` per
micro-batch (the expert-parallel all-to-all, with a per-wait timeout like a
collective's). Rank 0 "compiles": its micro-batch times follow the report's
warm-up curve (a 20-minute cold first micro-batch, then 489 s -> 22 s; time is
scaled 1 s : 800 s). Unguarded, the collective timeout is torch's NCCL default
(10 min): the peers time out in the all-to-all while rank 0 is silent (the
report's "15 NCCL watchdog timeouts + one silent rank") and the job is called
deadlocked. Guarded, groups carry the configured 30 min and
``t1ops.guards.watchdog.Watchdog`` classifies the curve as ``warming_up``,
never ``hung``.

Part 2: a real child process reports a few micro-batches, then blocks forever
in ``_wait_in_all_to_all``. The watchdog learns its bound (3 x the longest
interval), calls it ``hung``, and dumps its Python stack with faulthandler
(SIGUSR1); the stack names the blocked function.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, register
from t1ops.config import GuardsConfig
from t1ops.errors import HangError
from t1ops.guards.dist import timeout_for
from t1ops.guards.watchdog import Watchdog, signal_stack_dumper

SCALE = 1 / 800.0                                      # scenario seconds per report second
CURVE_S = [1200, 489, 250, 120, 60, 22, 22, 22, 22]    # report, section 09; >30 min of compile in all
NCCL_BUILTIN_S = 600.0                                 # torch's NCCL default collective timeout
NUM_RANKS = 4
REPO = Path(__file__).resolve().parents[2]
STUCK_RANK = ("import sys, threading, time\nfrom t1ops.guards.watchdog import install_stack_dump\n"
              "f = install_stack_dump(sys.argv[1])\nprint('ready', flush=True)\n"
              "for step in range(4):\n    time.sleep(0.1)\n    print(f'step {step}', flush=True)\n"
              "def _wait_in_all_to_all():\n    threading.Event().wait()  # a peer that never arrives\n"
              "_wait_in_all_to_all()\n")


def _rank(rank: int, barrier: threading.Barrier, dog: Watchdog | None, lock: threading.Lock,
          timeouts: list) -> None:
    for step, report_s in enumerate(CURVE_S):
        time.sleep((report_s if rank == 0 else CURVE_S[-1]) * SCALE)  # rank 0 compiles, peers compute
        try:
            barrier.wait()  # the all-to-all: peers wait here for rank 0
        except threading.BrokenBarrierError:
            timeouts.append((rank, step))
            return
        if dog is not None:
            with lock:
                dog.report(rank, step)


def _warmup_job(collective_timeout_s: float, guarded: bool) -> dict:
    """Run the four ranks; with ``guarded`` a watchdog classifies them every 20 ms."""
    g = GuardsConfig()
    dog = Watchdog(range(NUM_RANKS), safety_factor=g.watchdog_safety_factor,
                   first_step_bound_s=g.watchdog_first_step_bound_s * SCALE, min_bound_s=g.watchdog_min_bound_s * SCALE,
                   warmup_ratio=g.watchdog_warmup_ratio, straggler_factor=g.watchdog_straggler_factor) if guarded else None
    barrier, lock, timeouts = threading.Barrier(NUM_RANKS, timeout=collective_timeout_s), threading.Lock(), []
    threads = [threading.Thread(target=_rank, args=(r, barrier, dog, lock, timeouts), daemon=True)
               for r in range(NUM_RANKS)]
    for t in threads:
        t.start()
    statuses: list[str] = []
    false_hang = None
    while any(t.is_alive() for t in threads):
        if dog is not None:
            with lock:
                try:
                    statuses.extend(s.status for s in dog.check().values())
                except HangError as err:
                    false_hang = str(err)
        time.sleep(0.02)
    return {"timeouts": sorted(timeouts), "statuses": sorted(set(statuses)), "false_hang": false_hang,
            "final": {r: s.status for r, s in dog.classify().items()} if dog else None}


def _stuck_job(tmp: Path) -> dict:
    """A real rank process that goes silent; the watchdog must call it hung and dump its stack."""
    path = tmp / "rank0.stacks"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", STUCK_RANK, str(path)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        g = GuardsConfig()
        dog = Watchdog([0], safety_factor=g.watchdog_safety_factor, min_bound_s=g.watchdog_min_bound_s * SCALE,
                       dump_stacks=signal_stack_dumper({0: proc.pid}, {0: path}, wait_s=10))
        for step in range(4):
            proc.stdout.readline()
            dog.report(0, step)
        silent_since = time.monotonic()
        deadline = silent_since + 30
        while time.monotonic() < deadline:
            try:
                dog.check()
            except HangError as err:
                return {"error": str(err), "detection_s": time.monotonic() - silent_since,
                        "bound_s": dog.bound_s(0)}
            time.sleep(0.02)
        return {"error": None, "detection_s": None, "bound_s": dog.bound_s(0)}
    finally:
        proc.kill()
        proc.wait()


@register("jit-as-deadlock", "a rank cold-compiling for >30 min looks like a deadlock to a fixed watchdog")
def run(tmp: Path) -> Outcome:
    unguarded = _warmup_job(NCCL_BUILTIN_S * SCALE, guarded=False)
    guarded = _warmup_job(timeout_for("nccl", GuardsConfig()).total_seconds() * SCALE, guarded=True)
    stuck = _stuck_job(tmp)
    error = stuck["error"] or ""
    peers = sorted({r for r, step in unguarded["timeouts"] if r != 0 and step == 0})
    fault_fired = peers == list(range(1, NUM_RANKS))  # every peer timed out waiting for the compiling rank
    caught = guarded["false_hang"] is None and "warming_up" in guarded["statuses"] and "hung" in error
    return Outcome(
        fault_fired=fault_fired,
        unguarded=(f"collective timeout ({NCCL_BUILTIN_S:g} s scaled) on ranks {peers} waiting in the all-to-all "
                   "while rank 0 was silent: declared a deadlock, job killed"),
        guarded=Guarded(caught=caught, detection_s=stuck["detection_s"], error=error[:2000]),
        invariants={
            "warm-up never called hung": guarded["false_hang"] is None and "hung" not in guarded["statuses"],
            "warm-up classified warming_up": "warming_up" in guarded["statuses"],
            "configured 30 min timeout survives the cold compile": guarded["timeouts"] == [],
            "stuck rank hung with its stack dumped": "_wait_in_all_to_all" in error,
        },
        details={"unguarded": unguarded, "guarded": guarded, "stuck_bound_s": stuck["bound_s"],
                 "scale": "1 s per 800 s: first micro-batch 1200 s (cold compile), then 489 s -> 22 s; "
                          "NCCL builtin 600 s -> 0.75 s, configured 1800 s -> 2.25 s"},
    )
