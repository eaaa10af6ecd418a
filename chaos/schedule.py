"""Seeded, randomised fault schedules against a short real campaign, fired where the work is.

A schedule is a list of faults (which fault, at which step, on which target, at which point of
the step's work, and for stalls whether it outlasts the guard's bound) drawn from a seed; the same
seed replays exactly the same schedule. :mod:`chaos.injector` fires each fault on the campaign's
own progress events -- mid-rollout after k trials of the step started, inside the trainer's step,
inside the weight-sync barrier -- with real mechanisms:

- ``kill-engine``: SIGKILL one engine process (the pool must mark it dead, resubmit its requests
  and recreate it at the next weight sync);
- ``stall-engine``: SIGSTOP one engine, then SIGCONT; a long stall (past failure_threshold pings)
  must get the engine marked dead and recreated, a short one must be absorbed;
- ``kill-worker``: SIGKILL a rollout worker's process (Ray restarts the actor and reruns its
  rollout; no trajectory may be lost or duplicated);
- ``stall-trainer``: SIGSTOP the trainer inside its step; a short stall must not be called hung,
  a long one (past the watchdog's learned bound) must be: the campaign stops with ``HangError``
  naming the trainer, with its stacks, and its books and checkpoints stay whole;
- ``fd-pressure``: open descriptors in the coordinator past the fd guard's warn fraction for a
  few of its sampling periods (the guard's own sampling thread must report ``fd.near_limit``).

After the run the invariants are checked: every finished step has its full batch, no sample id
appears twice, the run's exactly-once group audit holds (``summary.json["group_audit"]``), both roles' checkpoints load with valid checksums, every fault fired on work in
flight, and every must-catch fault has evidence that names its target and falls in its window.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from chaos.injector import Fault, Injector
from t1ops.errors import ConfigError
from t1ops.guards.checkpoints import list_steps, step_dir_name
from t1ops.guards.sharded_checkpoints import verify_role

FAULTS = ("kill-engine", "stall-engine", "kill-worker", "stall-trainer", "fd-pressure")
TRIGGERS = {"kill-engine": ("mid-rollout", "in-sync"), "stall-engine": ("mid-rollout", "in-sync"),
            "kill-worker": ("mid-rollout",), "stall-trainer": ("in-train",), "fd-pressure": ("mid-rollout",)}
#: Seconds after a fault within which its evidence must appear (besides the stall itself).
EVIDENCE_SLACK_S = 30.0
#: A killed rollout worker is noticed when the coordinator collects its rollout, which is the step
#: that consumes the batch (with the one-step pipeline, up to a whole step after the kill).
SLACK_S = {"kill-worker": 120.0}


def make_schedule(seed: int, num_faults: int, num_steps: int, num_engines: int, num_workers: int,
                  batch_size: int = 4) -> list[Fault]:
    """``num_faults`` faults over steps 1..num_steps, each kind at least once when room allows.

    A long trainer stall ends the campaign (the hang is named and the run stops), so at most one
    is drawn and it goes to the last step; the first train step has no learned bound yet, so
    trainer stalls start at step 2.
    """
    rng = random.Random(seed)
    kinds = list(FAULTS)
    rng.shuffle(kinds)
    kinds = (kinds * (num_faults // len(kinds) + 1))[:num_faults]
    targets = {"kill-engine": num_engines, "stall-engine": num_engines, "kill-worker": num_workers}
    draws = [(k, rng.choice(TRIGGERS[k]), k in ("stall-engine", "stall-trainer") and rng.random() < 0.5,
              rng.randrange(targets.get(k, 1)), rng.randint(1, max(1, batch_size - 1)), rng.random())
             for k in kinds]
    first_long_trainer = next((i for i, d in enumerate(draws) if d[0] == "stall-trainer" and d[2]), None)
    faults, engine_steps = [], set()
    for i, (k, trigger, long, target, after, u) in enumerate(draws):
        if k == "stall-trainer" and long and (i != first_long_trainer or num_steps < 2):
            long = False
        lo = 2 if k == "stall-trainer" and num_steps >= 2 else 1
        hi = num_steps - 1 if first_long_trainer is not None and trigger == "in-sync" and num_steps > 1 else num_steps
        step = num_steps if k == "stall-trainer" and long else lo + int(u * (hi - lo + 1))
        if k in ("kill-engine", "stall-engine"):  # one engine fault per step: the other engine keeps serving
            free = [s for s in range(lo, hi + 1) if s not in engine_steps]
            step = min(free, key=lambda s: (abs(s - step), s)) if free else step
            engine_steps.add(step)
        faults.append(Fault(f"f{i}", step, k, target, trigger, after if trigger == "mid-rollout" else 0, long))
    return sorted(faults, key=lambda f: (f.step, f.trigger != "mid-rollout", f.id))


# Faults the guardrails must notice, the events that prove they did, and the event field that must
# name the fault's target. The other faults must be absorbed: the step completes, no hang declared.
EVIDENCE = {"kill-engine": (("engine.dead",), "slot"),
            # an engine still in its warm-up grace (recreated at the last sync) is graced, not killed:
            # the guard's notice is then engine.ping_missed_in_grace, which is the right call
            "stall-engine": (("engine.dead", "engine.ping_missed_in_grace"), "slot"),
            "kill-worker": (("campaign.worker_restarted",), "worker"),
            "stall-trainer": (("watchdog.hung", "campaign.trainer_hung"), None),
            "fd-pressure": (("fd.near_limit",), "pid")}
MUST_NOT = {"stall-trainer": ("watchdog.hung", "campaign.trainer_hung"), "stall-engine": ("engine.dead",)}


def must_catch(fired: dict) -> bool:
    """Kills and fd pressure are always caught; stalls only when they outlast the guard's bound."""
    return fired["kind"] in ("kill-engine", "kill-worker", "fd-pressure") or fired["long"]


def _target_value(fired: dict, key: str | None):
    return {"slot": fired["target"], "worker": fired["target"], "pid": fired["pid"]}.get(key)


def evidence_for(fired: dict, events: list[dict]) -> list[dict]:
    """Events that prove ``fired`` was caught: right name, naming its target, inside its window."""
    names, key = EVIDENCE[fired["kind"]]
    lo, hi = fired["at"], fired["at"] + fired["duration_s"] + SLACK_S.get(fired["kind"], EVIDENCE_SLACK_S)
    return [e for e in events if e["name"] in names and lo <= e["time"] <= hi
            and (key is None or e.get(key) == _target_value(fired, key))]


def wrongly_named(fired: dict, events: list[dict]) -> list[dict]:
    """For a stall inside the bound: events that called it dead/hung within its window."""
    names = MUST_NOT.get(fired["kind"], ())
    key = EVIDENCE[fired["kind"]][1]
    lo, hi = fired["at"], fired["at"] + fired["duration_s"] + EVIDENCE_SLACK_S
    return [e for e in events if e["name"] in names and lo <= e["time"] <= hi
            and (key is None or e.get(key) == _target_value(fired, key))]


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for f in (run_dir / "telemetry").rglob("events.jsonl")
            for line in f.read_text().splitlines() if line.strip()]


def check_invariants(run_dir: Path, injector: Injector, batch_size: int, stopped_by: str = "") -> dict:
    """The invariants of a scheduled run (see module docstring)."""
    from t1ops.audit import read_trajectory

    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    steps = summary.get("steps", [])
    audit = summary.get("group_audit")  # written when the step loop finished (t1ops.campaign.group_ledger)
    ids = [read_trajectory(p).meta["sample_id"] for p in sorted((run_dir / "dumps").glob("*.c0.npz"))]
    dup = [i for i, n in Counter(ids).items() if n > 1]
    per_step = Counter(i.split("-g")[0] for i in ids)
    ckpt_ok = True
    for role in ("actor", "critic"):
        for s in list_steps(run_dir / "checkpoints" / role):
            verify_role(run_dir / "checkpoints" / role / step_dir_name(s), role)  # raises if corrupt
        ckpt_ok &= bool(list_steps(run_dir / "checkpoints" / role))
    events = _events(run_dir)
    verdicts = []
    for f in injector.fired:
        ev = evidence_for(f, events)
        wrong = [] if must_catch(f) else wrongly_named(f, events)
        ok = bool(ev) if must_catch(f) else not wrong
        verdicts.append({"id": f["id"], "kind": f["kind"], "work": f["work"], "must_catch": must_catch(f),
                         "ok": ok, "evidence": [f"{e['name']} +{e['time'] - f['at']:.2f} s" for e in ev[:2]],
                         "wrongly_named": [e["name"] for e in wrong[:2]]})
    expected_stop = any(f["kind"] == "stall-trainer" and f["long"] for f in injector.fired)
    return {"no_trajectory_duplicated": not dup,
            "no_trajectory_lost": all(per_step[f"st{s['step']}"] == batch_size for s in steps)
            and all(s["ledger"]["missing"] == 0 for s in steps),
            "every_group_trained_exactly_once": audit["ok"] if audit is not None else bool(stopped_by),
            "checkpoints_intact": ckpt_ok,
            "every_fault_fired_on_work_in_flight": len(injector.fired) == len(injector.schedule)
            and all(f["in_flight"] for f in injector.fired) and not injector.error,
            "every_fault_caught_or_absorbed": all(v["ok"] for v in verdicts),
            "stopped_only_by_a_named_hang": (not stopped_by) or (expected_stop and "HangError" in stopped_by),
            "faults": verdicts,
            "detail": f"duplicates={dup[:3]} per_step={dict(per_step)} injector_error={injector.error!r} "
                      f"stopped_by={stopped_by[:300]!r}"}


def schedule_config(base, steps: int):
    """A short campaign for schedules: two engines (so one can die), guards with short bounds so a
    long stall is caught inside the run, and the fd guard sampling on its own every 2 s."""
    if base.run.mode == "fully_async":
        # Mid-rollout faults count a step's trials by their ``st{step}-`` ids; fully async group
        # workers have no step until the trainer takes their group (``ag{k}-`` ids).
        raise ConfigError("fault schedules run on the sync and one_step pipelines only: a fully_async "
                          "trial belongs to no step until the trainer takes its group. Set run.mode to "
                          "'one_step' for `t1ops chaos schedule`; the fully async path has its own "
                          "scenario (long-tail-stall).", key="run.mode")
    cfg = base.model_copy(deep=True)
    cfg.run.steps = steps
    cfg.engine.num_engines = 2
    cfg.engine.health_interval_s = 1.0
    cfg.engine.failure_threshold = 2
    cfg.engine.warmup_grace_s = 30.0
    cfg.engine.request_timeout_s = 2.0  # a missed ping is decided within ~4.5 s, so a long stall stays short
    cfg.engine.request_attempts = 2
    cfg.engine.retry_backoff_s = 0.1
    cfg.rollout.batch_size = 4
    cfg.trainer.warm_start_steps = 2
    cfg.guards.fd_warn_fraction = 0.5
    cfg.guards.fd_sample_interval_s = 2.0
    cfg.guards.watchdog_min_bound_s = 10.0
    cfg.guards.watchdog_safety_factor = 1.5
    return cfg


def run_schedule(seed: int, num_faults: int, base_cfg, out_dir: str, num_steps: int = 4) -> dict:
    """Run a short campaign under the seeded schedule and check the invariants.

    Returns ``{"seed", "schedule", "fired", "invariants", "passed", "run_dir"}``; the seed is in
    the result so a failure replays exactly. A long trainer stall stops the campaign with a named
    ``HangError``: that is the expected outcome, checked like any other evidence.
    """
    from t1ops.campaign.launch import run_campaign

    cfg = schedule_config(base_cfg, num_steps)
    schedule = make_schedule(seed, num_faults, num_steps, cfg.engine.num_engines, cfg.rollout.num_workers,
                             cfg.rollout.batch_size)
    injector = Injector(schedule)
    stopped_by = ""
    try:
        run_dir = run_campaign(cfg, out_dir=out_dir, show_progress=False, on_step=[injector])
    except Exception as err:
        stopped_by = f"{type(err).__name__}: {err}"
        if injector._campaign is None:
            raise RuntimeError(f"fault schedule seed={seed} failed before any fault: {stopped_by}") from err
        run_dir = Path(injector._campaign.run.path)
    finally:
        injector.stop()
    inv = check_invariants(run_dir, injector, cfg.rollout.batch_size, stopped_by)
    passed = all(v for k, v in inv.items() if k not in ("detail", "faults"))
    return {"seed": seed, "schedule": [asdict(f) for f in schedule], "fired": injector.fired,
            "invariants": inv, "passed": passed, "run_dir": str(run_dir)}
