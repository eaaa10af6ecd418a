"""fd-exhaustion: a full fd table drops result deliveries; collection sits at 0/16.

Fault (real): a Ray actor process (the node's rollout worker) starts with its
soft RLIMIT_NOFILE lowered to its open fds + 48 (the report: 1024 with 320
concurrent trials). It runs the step's 16 trials; each holds sandbox
connections (sockets) until its result is acknowledged and delivers its result
through a new pipe. With the table full, ``os.pipe()`` fails with EMFILE and the
delivery is dropped without a word, as the raylet did; the worker has finished
(``progress()`` counts 16) but its rollout never returns.

Production code on the path: a real local Ray cluster; the campaign's
collector ``t1ops.campaign.rollouts.Rollouts`` (``submit`` deals the groups
to the worker, ``collect`` waits on the Ray ref and pulses ``progress()``,
``set_num_sent`` gives the stall detector its ``num_sent`` probe);
``t1ops.campaign.guarding.CampaignGuards`` builds the ``FdGuard`` (watching the
coordinator and the worker's pid, as the campaign's ``pids`` does) and the
``StallDetector`` from ``[guards]``; ``t1ops.guards.fds.raise_nofile_limit`` is
called in the worker exactly where ``RolloutWorker.__init__`` calls it.

Still scenario code, and why: the worker is a stand-in (``NodeWorker``, the
interface of ``RolloutWorker``: ``pid``, ``progress``, ``rollout``) because the
real one needs engines and sandboxes per trial; its pipe delivery, dropping on
EMFILE, stands in for the raylet's. Ray itself could not be made to drop
silently here: with Ray 2.60 an actor whose table filled up inside a call died
loudly (``ActorDiedError``), and ``ray.init`` raises the driver's soft limit to
the hard limit before it starts the raylet, so a low soft limit never reaches
Ray's own processes. The limit is lowered in the worker process itself, at
start-up, before the guard's raise (the order a node with a low default has).

Unguarded (no fd raise, no stall bound): after the watch window ``collect`` has
not returned, 0/16 collected, no exception. Guarded: the raised limit (hard
limit above the soft one) collects 16/16; with the hard limit capped too (a
container ``--ulimit``) ``collect`` raises ``StallError`` after
``stall_timeout_s`` (2 s here, 300 s by default) naming the worker's fd usage at
its limit and the lost deliveries (workers sent 16, 0 arrived).
"""
from __future__ import annotations

import errno
import json
import math
import os
import queue
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register

NUM_TRIALS = 16            # the report's "collected 0/16": 4 groups x 4 samples
GROUP_SIZE = 4
HEADROOM = 48              # soft limit = open fds at start + 48; 16 trials x 4 connections want 64
CONNECTIONS_PER_TRIAL = 4
STALL_THRESHOLD_S = 2.0    # scaled from GuardsConfig.stall_timeout_s = 300 s
PATIENCE_S = 8.0           # how long the unguarded collector is watched (4x the scaled threshold)
REPO = Path(__file__).resolve().parents[2]


class NodeWorker:
    """Stand-in for ``RolloutWorker`` on a node whose nofile limit is low (see module docstring)."""

    def __init__(self, guarded: bool, cap_hard: bool) -> None:
        import t1ops.campaign.worker  # noqa: F401  the real worker's module: the trial specs unpickle without a cold import
        from t1ops.guards.fds import raise_nofile_limit

        soft, hard = len(os.listdir("/proc/self/fd")) + HEADROOM, resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, soft if cap_hard else hard))  # the fault
        if guarded:
            raise_nofile_limit()  # what RolloutWorker.__init__ does
        self.num_finished, self.dropped, self._stop = 0, 0, threading.Event()
        self._lock = threading.Lock()

    def pid(self) -> int:
        return os.getpid()

    def progress(self) -> int:
        return self.num_finished

    def state(self) -> dict:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return {"soft": soft, "hard": hard, "finished": self.num_finished, "dropped": self.dropped}

    def stop(self) -> None:
        self._stop.set()

    def _trial(self, i: int, started: threading.Barrier, acks: dict, deliveries: queue.Queue) -> None:
        conns = []
        for _ in range(CONNECTIONS_PER_TRIAL):  # sandbox connections, held until the result is acked
            try:
                conns.append(socket.socket())
            except OSError:
                break
        started.wait()
        with self._lock:
            self.num_finished += 1  # the trial is done and its result goes out
        try:
            r, w = os.pipe()  # the result delivery needs fds of its own
            os.write(w, json.dumps({"trial": i, "reward": 1.0}).encode())
            os.close(w)
            deliveries.put((i, r))
        except OSError as err:  # the raylet's behaviour: the delivery is dropped, nobody is told
            with self._lock:
                self.dropped += err.errno == errno.EMFILE
        while not (acks[i].wait(0.2) or self._stop.is_set()):
            pass
        for c in conns:
            c.close()

    def rollout(self, step: int, groups: list, accept_groups: int | None = None, trace: dict | None = None):
        from t1ops.campaign.trials import BatchResult, TrialResult

        specs = [s for g in groups for s in g]
        n, deliveries = len(specs), queue.Queue()
        acks, started = {i: threading.Event() for i in range(n)}, threading.Barrier(n)
        for i in range(n):
            threading.Thread(target=self._trial, args=(i, started, acks, deliveries), daemon=True).start()
        results = []
        while len(results) < n and not self._stop.is_set():  # waits for every result, as a collector does
            try:
                i, r = deliveries.get(timeout=0.2)
            except queue.Empty:
                continue
            got = json.loads(os.read(r, 4096))
            results.append(TrialResult(task=specs[i].task, group_id=specs[i].group_id, reward=got["reward"],
                                       sample_id=f"{specs[i].group_id}-s{specs[i].sample_idx}"))
            os.close(r)
            acks[i].set()
        books = {"expected": n, "completed": len(results), "failed": 0, "cancelled": 0, "missing": n - len(results)}
        return BatchResult(results=results, ledger=books, failed={}, node="local")


def _phase(ray, name: str, guarded: bool, cap_hard: bool, run_dir: Path) -> dict:
    """One collection through the production Rollouts (+ CampaignGuards when guarded)."""
    from t1ops.campaign.guarding import CampaignGuards
    from t1ops.campaign.rollouts import Rollouts
    from t1ops.config import CampaignConfig, parse_config
    from t1ops.errors import StallError
    from t1ops.guards.fds import StallDetector

    cfg = parse_config({"rollout": {"batch_size": NUM_TRIALS, "n_samples_per_prompt": GROUP_SIZE},
                        "guards": {"stall_timeout_s": STALL_THRESHOLD_S, "fd_sample_interval_s": 0.5}},
                       CampaignConfig, source=f"fd-exhaustion {name}")
    worker = ray.remote(NodeWorker).options(num_cpus=0, max_concurrency=4).remote(guarded, cap_hard)
    box: dict = {}
    guards = CampaignGuards(cfg, run_dir, dead_engines=lambda: [],
                            pids=lambda: [os.getpid(), *(box["r"].pids if "r" in box else [])]) if guarded else None
    stall = guards.stall if guarded else StallDetector(math.inf, what="trials")  # unguarded: no stall bound
    rollouts = box["r"] = Rollouts(cfg, [worker], [f"task-{k}" for k in range(NUM_TRIALS // GROUP_SIZE)], stall)
    t0 = time.monotonic()
    pending = rollouts.submit(step=1)
    out: dict = {"error": None, "detection_s": None, "collected": 0, "returned": False}

    def collect() -> None:
        try:
            results, _, books = rollouts.collect(pending)
            out.update(collected=len(results), returned=True, books=books, collected_s=time.monotonic() - t0)
        except StallError as err:
            out.update(error=str(err), detection_s=time.monotonic() - t0)
        except Exception as err:  # the worker killed at the end of an unguarded watch
            out.setdefault("ended_by", type(err).__name__)

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    thread.join(PATIENCE_S if not guarded else 120)
    out.update(still_collecting=thread.is_alive(), num_sent=rollouts.num_sent, worker_pid=rollouts.pids[0],
               num_completed=stall.num_completed, worker=ray.get(worker.state.remote(), timeout=60))
    ray.get(worker.stop.remote(), timeout=60)
    ray.kill(worker)
    thread.join(30)
    if guards is not None:
        guards.stop()
    return out


def coordinator(run_dir: Path) -> dict:
    """The child coordinator: one local Ray cluster, three collections."""
    import ray

    # "local": its own cluster, never one another process left in /tmp/ray/ray_current_cluster
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        return {"unguarded": _phase(ray, "unguarded", False, False, run_dir),
                "raised": _phase(ray, "raised", True, False, run_dir),
                "capped": _phase(ray, "capped", True, True, run_dir)}
    finally:
        ray.shutdown()


def _spawn(tmp: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    res = subprocess.run([sys.executable, "-c", "import sys; from chaos.scenarios.fd_exhaustion import main; "
                          "sys.exit(main(sys.argv[1]))", str(tmp)],
                         capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"fd-exhaustion coordinator failed (rc {res.returncode}): {res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


@register("fd-exhaustion", "a full fd table silently drops result deliveries; collection stalls at 0/16")
def run(tmp: Path) -> Outcome:
    out = _spawn(tmp)
    unguarded, raised, capped = out["unguarded"], out["raised"], out["capped"]
    uw = unguarded["worker"]
    fault_fired = uw["soft"] < uw["hard"] and uw["dropped"] > 0 and unguarded["num_completed"] == 0
    error = capped["error"] or ""
    caught = raised["collected"] == NUM_TRIALS and "fd usage near the soft nofile limit" in error
    tl = Timeline()  # the capped phase, from its submit (every delivery is dropped from then on)
    tl.fault(at=0.0)
    tl.after_fault(detected=capped["detection_s"], stopped=capped["detection_s"])
    restart = raised.get("collected_s")
    return Outcome(
        fault_fired=fault_fired,
        unguarded=(f"Rollouts.collect after {PATIENCE_S:g} s: collected {unguarded['num_completed']}/{NUM_TRIALS}, "
                   f"worker reports {unguarded['num_sent']} finished, still waiting, no exception "
                   f"({uw['dropped']} deliveries dropped with EMFILE at soft nofile {uw['soft']})"),
        guarded=Guarded(caught=caught, detection_s=capped["detection_s"], error=error),
        invariants={
            "unguarded_collection_stalls_silently": unguarded["still_collecting"] and unguarded["error"] is None
            and unguarded["num_completed"] == 0,
            "unguarded_worker_sent_every_result": unguarded["num_sent"] == NUM_TRIALS,
            "raised_limit_collects_every_result": raised["collected"] == NUM_TRIALS
            and raised["worker"]["soft"] == raised["worker"]["hard"] and raised["worker"]["dropped"] == 0,
            "capped_limit_stall_named_by_production_detector": capped["detection_s"] is not None
            and capped["worker"]["soft"] == capped["worker"]["hard"],
            "stall_names_the_lost_deliveries": f"workers sent all {NUM_TRIALS} trials, 0 arrived" in error,
            "stall_names_the_workers_fds": f"pid {capped['worker_pid']}: " in error,
        },
        details={**out, "stall_threshold_s": STALL_THRESHOLD_S, "scaled_from": "soft nofile 1024, stall_timeout_s 300"},
        recovery=tl.recovery(how="stopped with StallError (hard cap); the restart with the limit raised collected "
                                 + (f"{NUM_TRIALS}/{NUM_TRIALS} in {restart:.2f} s" if restart else "nothing")),
    )


def main(run_dir: str) -> int:
    print(json.dumps(coordinator(Path(run_dir))))
    return 0
