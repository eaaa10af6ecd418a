"""Fire a fault schedule where the work is: on the campaign's own progress events.

A fault waits for its trigger, observed from the running campaign, not for a step boundary
(at a step boundary, with the one-step pipeline, the batch is already generated and the
trainer idle):

- ``mid-rollout``: once ``after_trials`` trials of the fault's step have *started* (the
  workers' ``trial.started`` events in ``telemetry/*/events.jsonl``) -- the rollout is in flight;
- ``in-train``: the coordinator's ``campaign.train_submitted`` for the step -- the trainer is
  inside its step;
- ``in-sync``: the coordinator's ``campaign.sync_barrier`` for the step -- the weight-update
  barrier is under way.

Each firing records the fault id, the pid it hit, the monotonic and wall times, and what the
work was at that instant ("trial 3/4 of step 2 started", "train step 3 submitted 0.21 s ago").
Evidence is later matched to the fault by id: the guard's event must name the fault's target
and fall inside the fault's window (see :func:`chaos.schedule.check_invariants`).
"""
from __future__ import annotations

import json
import os
import resource
import signal
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from t1ops import telemetry

POLL_S = 0.05


@dataclass(frozen=True)
class Fault:
    id: str            # "f2": names the fault in the report and in its evidence
    step: int
    kind: str          # kill-engine | stall-engine | kill-worker | stall-trainer | fd-pressure
    target: int        # engine slot / worker index (0 where there is one target)
    trigger: str       # mid-rollout | in-train | in-sync
    after_trials: int  # mid-rollout: fire once this many of the step's trials have started
    long: bool         # stalls: past the guard's bound (must be caught) or inside it (must be absorbed)


class _EventTail:
    """New events of every role's ``events.jsonl`` under a run's telemetry directory."""

    def __init__(self, telemetry_dir: Path) -> None:
        self.dir = telemetry_dir
        self._offsets: dict[Path, int] = {}

    def poll(self) -> list[dict]:
        out = []
        for path in sorted(self.dir.rglob("events.jsonl")):
            off = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(off)
                data = fh.read()
            cut = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
            self._offsets[path] = off + cut
            out += [json.loads(line) for line in data[:cut].splitlines() if line.strip()]
        return out


@dataclass
class Injector:
    """Watches a running campaign and fires each fault of ``schedule`` at its trigger."""

    schedule: list[Fault]
    fired: list[dict] = field(default_factory=list)
    _held_fds: list[int] = field(default_factory=list)
    _fd_lock: threading.Lock = field(default_factory=threading.Lock)  # the release timer and stop() race
    _started: dict[int, int] = field(default_factory=dict)   # step -> trials started
    _finished: dict[int, int] = field(default_factory=dict)  # step -> trials finished
    _coord: dict[tuple[str, int], float] = field(default_factory=dict)  # (event, step) -> wall time
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _campaign: object = None
    _engine_pids: list = field(default_factory=list)  # refreshed off the firing path (the router can be busy)
    error: str = ""
    _t0: float = 0.0  # wall time watching began: older in-process events belong to earlier campaigns

    def __call__(self, c, step: int) -> None:
        """The campaign's ``on_step`` seam: only used to start watching (at step 1)."""
        if self._thread is None:
            self._campaign, self._t0 = c, time.time()
            self._thread = threading.Thread(target=self._watch, name="chaos-injector", daemon=True)
            self._thread.start()
            threading.Thread(target=self._refresh_engines, name="chaos-engine-pids", daemon=True).start()

    def _refresh_engines(self) -> None:
        """Keep the engines' pids current (recreated engines get new ones) without ever blocking a firing."""
        import ray

        while not self._stop.is_set() and ray.is_initialized():  # never after the campaign's shutdown
            try:
                self._engine_pids = ray.get(self._campaign.router.engine_pids.remote(), timeout=10)
            except Exception:  # the router is busy or gone: keep the last known pids
                pass
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._release_fds()

    def _watch(self) -> None:
        c = self._campaign
        tail = _EventTail(Path(c.run.path) / "telemetry")
        pending = list(self.schedule)
        try:
            while pending and not self._stop.is_set():
                for ev in tail.poll():
                    if ev["name"] in ("trial.started", "trial.finished"):
                        books = self._started if ev["name"] == "trial.started" else self._finished
                        step = _step_of(ev.get("trial", ""))
                        books[step] = books.get(step, 0) + 1
                self._observe_coord()
                for f in [f for f in pending if self._due(f)]:
                    pending.remove(f)
                    self._fire(c, f)
                time.sleep(POLL_S)
        except Exception as err:  # the schedule must say why it stopped firing
            self.error = f"{type(err).__name__}: {err}"

    def _due(self, f: Fault) -> bool:
        if f.trigger == "mid-rollout":
            return self._started.get(f.step, 0) >= f.after_trials
        name = "campaign.train_submitted" if f.trigger == "in-train" else "campaign.sync_barrier"
        return (name, f.step) in self._coord

    def _work(self, f: Fault) -> str:
        """What was in flight when ``f`` fired."""
        if f.trigger == "mid-rollout":
            started, finished = self._started.get(f.step, 0), self._finished.get(f.step, 0)
            return f"rollout of step {f.step}: {started} trials started, {finished} finished"
        name = "campaign.train_submitted" if f.trigger == "in-train" else "campaign.sync_barrier"
        ago = time.time() - self._coord[(name, f.step)]
        what = "train step" if f.trigger == "in-train" else "weight-sync barrier after step"
        return f"{what} {f.step} (began {ago:.2f} s before)"

    def _fire(self, c, f: Fault) -> None:
        import ray

        work, t_wall = self._work(f), time.time()
        if f.kind in ("kill-engine", "stall-engine"):
            slot, pid = _live_engine(self._engine_pids or ray.get(c.router.engine_pids.remote()), f.target)
            f = replace(f, target=slot)  # the evidence must name the engine really hit
            if f.kind == "kill-engine":
                os.kill(pid, signal.SIGKILL)
                observed, dur = f"engine slot {slot} pid {pid} SIGKILLed", 0.0
            else:
                dur = stall_seconds(c, f)
                observed = _stop_for(pid, dur, f"engine slot {slot} pid {pid}")
        elif f.kind == "kill-worker":
            pid = ray.get(c.workers[f.target % len(c.workers)].pid.remote())
            os.kill(pid, signal.SIGKILL)
            observed, dur = f"rollout worker {f.target} pid {pid} SIGKILLed", 0.0
        elif f.kind == "stall-trainer":
            pid, dur = c.guards.trainer_pid, stall_seconds(c, f)
            observed = _stop_for(pid, dur, f"trainer pid {pid}")
        elif f.kind == "fd-pressure":
            pid, dur = os.getpid(), FD_HOLD_S
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            want = int(soft * c.cfg.guards.fd_warn_fraction) + 8 - len(os.listdir("/proc/self/fd"))
            held = [os.open("/dev/null", os.O_RDONLY) for _ in range(max(0, want))]
            with self._fd_lock:
                self._held_fds += held
            threading.Timer(dur, self._release_fds).start()
            observed = f"{len(held)} fds opened in the coordinator (soft limit {soft}) for {dur:g} s"
        else:
            raise ValueError(f"unknown fault {f.kind}")
        in_flight = (self._started.get(f.step, 0) > self._finished.get(f.step, 0)) if f.trigger == "mid-rollout" \
            else not self._after(f)
        self.fired.append({**asdict(f), "pid": pid, "duration_s": dur, "observed": observed, "work": work,
                           "in_flight": in_flight, "at": t_wall})

    def _after(self, f: Fault) -> bool:
        """The work ``f`` targets already ended when it fired (the train result / the sync came back)."""
        done = "campaign.train_done" if f.trigger == "in-train" else "campaign.sync_done"
        return any(e.get("step") == f.step for e in self._coord_events(done))

    def _observe_coord(self) -> None:
        for ev in self._coord_events("campaign.train_submitted", "campaign.sync_barrier"):
            self._coord.setdefault((ev["name"], int(ev["step"])), ev["time"])

    def _coord_events(self, *names: str) -> list[dict]:
        """This campaign's coordinator events called ``names``. The in-process ring is shared by
        every campaign the process ran (the test suite runs many), and it is bounded, so events are
        selected by time, never by position."""
        return [e for e in telemetry.recent_events(since=self._t0) if e["name"] in names]

    def _release_fds(self) -> None:
        # The release timer and stop() can race: without the lock both could close the same fd
        # numbers, the second time closing whatever the process had reopened there (its stdout).
        with self._fd_lock:
            held, self._held_fds = self._held_fds, []
        for fd in held:
            os.close(fd)


FD_HOLD_S = 6.0  # three of the fd guard's sampling periods in the schedule's config


def stall_seconds(c, f: Fault) -> float:
    """A stall inside the guard's bound (absorbed) or past it (must be caught), from the live guard."""
    if f.kind == "stall-trainer":
        bound = c.guards.watchdog.bound_s(0) if c.guards.watchdog is not None else 60.0
    else:  # an engine is dead after failure_threshold missed pings; one ping can take its whole
        e = c.cfg.engine  # bounded-HTTP deadline (attempts x (timeout + backoff)) before it counts as missed
        ping_s = e.request_attempts * (e.request_timeout_s + e.retry_backoff_s * 2 ** (e.request_attempts - 1))
        bound = e.failure_threshold * (e.health_interval_s + ping_s)
    return round(bound * 2 + 2, 1) if f.long else round(min(2.0, bound / 4), 1)


def _live_engine(pids: list[int], target: int) -> tuple[int, int]:
    """(slot, pid) of the target engine, or of the next live one if the target is already dead (a
    killed engine is only recreated at the next weight sync)."""
    import psutil

    for k in range(len(pids)):
        slot = (target + k) % len(pids)
        try:
            if psutil.Process(pids[slot]).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return slot, pids[slot]
        except psutil.NoSuchProcess:
            continue
    raise RuntimeError(f"no live engine to fault among pids {pids}")


def _step_of(trial: str) -> int:
    """``st3-g1-task-s0`` -> 3 (the worker's sample ids start with the step)."""
    try:
        return int(trial.split("-", 1)[0].removeprefix("st"))
    except ValueError:
        return -1


def _stop_for(pid: int, seconds: float, what: str) -> str:
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, _resume, (pid,))
    timer.daemon = True
    timer.start()
    return f"{what} SIGSTOPped for {seconds:g} s"


def _resume(pid: int) -> None:
    """SIGCONT a stalled process; one the guardrail has already killed and replaced is fine."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
