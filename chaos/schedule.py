"""Seeded, randomised fault schedules against a short real campaign.

A schedule is a list of faults (which fault, at which step, on which target)
drawn from a seed; the same seed replays exactly the same schedule. Faults are
injected through the campaign's ``on_step`` seam with real mechanisms:

- ``kill-engine``: SIGKILL one engine process (the pool must resubmit its
  requests and recreate it at the next weight sync);
- ``stall-engine``: SIGSTOP one engine for a few seconds, then SIGCONT (bounded
  control plane and health pings; requests resubmitted or served late);
- ``kill-worker``: SIGKILL a rollout worker's process (Ray restarts the actor
  and reruns its rollout; no trajectory may be lost or duplicated);
- ``stall-trainer``: SIGSTOP the trainer for a few seconds (the watchdog must
  not call it hung; the step completes);
- ``fd-pressure``: open descriptors in the coordinator past the fd guard's warn
  fraction for the rest of the step (the guard must report ``fd.near_limit``).

After the run the invariants are checked: every step has its full batch, no
sample id appears twice, both roles' checkpoints load with valid checksums,
and every fault that fired was either recovered from (the campaign finished
and the step's books are whole) or reported by name in the run's events.
"""
from __future__ import annotations

import json
import os
import random
import resource
import signal
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

FAULTS = ("kill-engine", "stall-engine", "kill-worker", "stall-trainer", "fd-pressure")
STALL_S = 3.0


@dataclass(frozen=True)
class Fault:
    step: int
    kind: str
    target: int  # engine slot / worker index (0 where there is one target)


def make_schedule(seed: int, num_faults: int, num_steps: int, num_engines: int, num_workers: int) -> list[Fault]:
    """``num_faults`` faults over steps 1..num_steps, each kind at least once when room allows."""
    rng = random.Random(seed)
    kinds = list(FAULTS)
    rng.shuffle(kinds)
    kinds = (kinds * (num_faults // len(kinds) + 1))[:num_faults]
    targets = {"kill-engine": num_engines, "stall-engine": num_engines, "kill-worker": num_workers}
    faults = [Fault(rng.randint(1, num_steps), k, rng.randrange(targets.get(k, 1))) for k in kinds]
    return sorted(faults, key=lambda f: (f.step, f.kind))


@dataclass
class Injector:
    """The ``on_step`` hook that fires a schedule and records what really happened."""

    schedule: list[Fault]
    fired: list[dict] = field(default_factory=list)
    _held_fds: list[int] = field(default_factory=list)

    def __call__(self, c, step: int) -> None:
        self._release_fds()
        for f in [f for f in self.schedule if f.step == step]:
            self.fired.append({**asdict(f), "observed": self._fire(c, f), "at": time.time()})

    def _fire(self, c, f: Fault) -> str:
        import ray

        if f.kind in ("kill-engine", "stall-engine"):
            pids = ray.get(c.router.engine_pids.remote())
            pid = pids[f.target % len(pids)]
            if f.kind == "kill-engine":
                os.kill(pid, signal.SIGKILL)
                return f"engine pid {pid} SIGKILLed"
            return _stop_for(pid, STALL_S, f"engine pid {pid}")
        if f.kind == "kill-worker":
            pid = ray.get(c.workers[f.target % len(c.workers)].pid.remote())
            os.kill(pid, signal.SIGKILL)  # while this step's batch (submitted last step) may still generate
            return f"rollout worker pid {pid} SIGKILLed"
        if f.kind == "stall-trainer":
            return _stop_for(c.guards.trainer_pid, STALL_S, f"trainer pid {c.guards.trainer_pid}")
        if f.kind == "fd-pressure":
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            want = int(soft * c.cfg.guards.fd_warn_fraction) + 8 - len(os.listdir("/proc/self/fd"))
            self._held_fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(max(0, want))]
            c.guards.fd_guard.sample()
            return f"{len(self._held_fds)} fds opened (soft limit {soft})"
        raise ValueError(f"unknown fault {f.kind}")

    def _release_fds(self) -> None:
        for fd in self._held_fds:
            os.close(fd)
        self._held_fds = []


def _stop_for(pid: int, seconds: float, what: str) -> str:
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(seconds, os.kill, (pid, signal.SIGCONT)).start()
    return f"{what} SIGSTOPped for {seconds:g} s"


# Faults the guardrails must notice, and the events (by name) that prove they did. The other
# faults must be absorbed: the step completes with whole books and no hang is declared.
EVIDENCE = {"kill-engine": ("engine.dead", "engine.request_resubmitted"),
            "kill-worker": ("campaign.worker_restarted",),
            "fd-pressure": ("fd.near_limit",)}
MUST_NOT = {"stall-trainer": ("watchdog.hung", "campaign.trainer_hung")}


def check_invariants(run_dir: Path, injector: Injector, batch_size: int) -> dict[str, bool | str]:
    """The invariants of a scheduled run (see module docstring)."""
    from t1ops.audit import read_trajectory
    from t1ops.guards.checkpoints import list_steps, load_checkpoint, step_dir_name

    summary = json.loads((run_dir / "summary.json").read_text())
    ids = [read_trajectory(p).meta["sample_id"] for p in sorted((run_dir / "dumps").glob("*.c0.npz"))]
    dup = [i for i, n in Counter(ids).items() if n > 1]
    per_step = Counter(i.split("-g")[0] for i in ids)
    ckpt_ok = True
    for role in ("actor", "critic"):
        for s in list_steps(run_dir / "checkpoints" / role):
            load_checkpoint(run_dir / "checkpoints" / role / step_dir_name(s), role)  # raises if corrupt
        ckpt_ok &= bool(list_steps(run_dir / "checkpoints" / role))
    events = {json.loads(line)["name"] for f in (run_dir / "telemetry").rglob("events.jsonl")
              for line in f.read_text().splitlines() if line.strip()}
    unexplained = [f["kind"] for f in injector.fired
                   if not any(e in events for e in EVIDENCE.get(f["kind"], ())) and f["kind"] in EVIDENCE]
    misnamed = [f["kind"] for f in injector.fired if any(e in events for e in MUST_NOT.get(f["kind"], ()))]
    return {"no_trajectory_duplicated": not dup,
            "no_trajectory_lost": all(per_step[f"st{s['step']}"] == batch_size for s in summary["steps"])
            and all(s["ledger"]["missing"] == 0 for s in summary["steps"]),
            "checkpoints_intact": ckpt_ok,
            "every_fault_recovered_or_named": not unexplained and not misnamed,
            "detail": f"duplicates={dup[:3]} per_step={dict(per_step)} unnoticed={unexplained} misnamed={misnamed}"}


def schedule_config(base, steps: int):
    """A short campaign for schedules: two engines (so one can die), two skim-free workers' worth of load."""
    cfg = base.model_copy(deep=True)
    cfg.run.steps = steps
    cfg.engine.num_engines = 2
    cfg.engine.health_interval_s = 1.0
    cfg.engine.failure_threshold = 2
    cfg.engine.warmup_grace_s = 30.0
    cfg.rollout.batch_size = 4
    cfg.trainer.warm_start_steps = 2
    cfg.guards.fd_warn_fraction = 0.5
    return cfg


def run_schedule(seed: int, num_faults: int, base_cfg, out_dir: str, num_steps: int = 4) -> dict:
    """Run a short campaign under the seeded schedule and check the invariants.

    Returns ``{"seed", "schedule", "fired", "invariants", "passed", "run_dir"}``; on any
    failure the seed is in the result (and in the exception text) so it replays exactly.
    """
    from t1ops.campaign.launch import run_campaign

    cfg = schedule_config(base_cfg, num_steps)
    schedule = make_schedule(seed, num_faults, num_steps, cfg.engine.num_engines, cfg.rollout.num_workers)
    injector = Injector(schedule)
    try:
        run_dir = run_campaign(cfg, out_dir=out_dir, show_progress=False, on_step=[injector])
    except Exception as err:
        raise RuntimeError(f"fault schedule seed={seed} failed: {type(err).__name__}: {err}; replay with "
                           f"`t1ops chaos schedule --seed {seed} --faults {num_faults}`") from err
    finally:
        injector._release_fds()
    inv = check_invariants(run_dir, injector, cfg.rollout.batch_size)
    passed = all(v for k, v in inv.items() if k != "detail")
    return {"seed": seed, "schedule": [asdict(f) for f in schedule], "fired": injector.fired,
            "invariants": inv, "passed": passed, "run_dir": str(run_dir)}
