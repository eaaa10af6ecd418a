"""`t1ops chaos verify-recovery`: a run that survived a fault is the run it would have been.

The tiny campaign in its deterministic configuration (sync mode, per-request sampling seeds,
batch-invariant engines; docs/determinism.md) runs 4 steps once clean and once with each fault:

- ``engine-kill``: one of the two engines is SIGKILLed while step ``KILL_STEP``'s trials generate;
  its requests are resubmitted to the live engine and the dead one is recreated at the barrier;
- ``coordinator-kill``: the `t1ops run` process is SIGKILLed mid-rollout of step ``KILL_STEP``
  and the run is resumed (``--resume``) from its newest verified step;
- ``trainer-kill``: the trainer's rank (the 1-rank trainer's Ray actor process) is SIGKILLed
  while it trains step ``KILL_STEP``; the campaign fails and the run is resumed.
- ``critic-skip`` (catalogue id critic-checkpoint-skipped; not in the default set): from step
  ``KILL_STEP`` on the trainer skips the critic's save silently (``chaos.critic_skip``); the check
  after the save stops the run with ``CheckpointError`` and the run is resumed from the last complete
  resume point.

Which catalogue ids' recovery is a sync-mode resume checked here (docs/failures.md, "Time to
recover"): coordinator-crash and resume-deadlock (``coordinator-kill``: the resumed run pushes the
checkpoint's weights before any rollout), critic-checkpoint-skipped (``critic-skip``).

Each run's per-step rewards and losses and the final actor checksum (the manifest's per-tensor
sha256, ``t1ops.guards.checkpoints``) are compared with the clean run's; any difference is a
failure (exit 1). Every process a run starts lives in its own session and is killed by pid.
"""
from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from chaos.procs import end_session, event_since, session_processes, start_campaign
from t1ops.guards.checkpoints import tensor_sha256
from t1ops.guards.sharded_checkpoints import CheckpointReader

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "tiny" / "campaign.toml"
STEPS, KILL_STEP = 4, 3
LABEL = 22  # width of the comparison table's row labels
RUN_TIMEOUT_S = 900
FAULTS = ("engine-kill", "coordinator-kill", "trainer-kill")   # the default set (and --combined's)
KNOWN = FAULTS + ("critic-skip",)
# The smallest tiny campaign that still exercises every path: 2 groups of 4 per step, 2 engines (so
# a killed one's requests have somewhere to go), a checkpoint and trainer state every step (so a
# resume restarts from the step before the fault), held-out eval of one task at steps 0, 2 and 4
# (a resumed run evaluates the same steps; this run is also the combination matrix's cell
# sync x 1 rank x disk, chaos.matrix.STANDS_IN).
DETERMINISTIC = [f"run.steps={STEPS}", "run.num_cpus=2", "run.mode=sync", "engine.num_engines=2",
                 "engine.batch_invariant=true", "rollout.seed_requests=true", "rollout.batch_size=8",
                 "rollout.n_samples_per_prompt=4", "rollout.max_turns=2", "rollout.max_new_tokens=32",
                 "trainer.warm_start_steps=60", "trainer.ppo_epochs=1", "trainer.save_every=1",
                 "eval.every_steps=2", "eval.samples_per_task=1", "eval.tasks=['count-0016']",
                 "tracking.tensorboard=false"]


@dataclass
class Record:
    """One run's fingerprint: per-step figures, the final actor checksum, and what happened."""

    name: str
    steps: list[dict] = field(default_factory=list)   # step, reward_mean, policy_loss, value_loss
    evals: list[int] = field(default_factory=list)    # the steps held-out eval ran at
    checksum: str | None = None
    fired: str = ""                                   # what the fault did ("" for the clean run)
    rcs: list[int | None] = field(default_factory=list)
    duration_s: float = 0.0
    run_dir: str | None = None


def fingerprint(run_dir: Path) -> tuple[list[dict], str | None]:
    """Per-step reward and losses from summary.json, and the checksum of the newest actor checkpoint
    (sha256 over its per-tensor sha256s, in name order; a checkpoint by shard: of its assembled tensors)."""
    rows = _summary(run_dir).get("steps", [])
    steps = [{k: r.get(k) for k in ("step", "reward_mean", "policy_loss", "value_loss")} for r in rows]
    actors = sorted((run_dir / "checkpoints" / "actor").glob("step_*"))
    if not actors:
        return steps, None
    reader = CheckpointReader(actors[-1], "actor")  # whole (1 rank) or by shard: the same full tensors
    tensors = reader.manifest["tensors"]
    digest = hashlib.sha256()
    for name in sorted(tensors):
        sha = tensors[name]["sha256"] if "sha256" in tensors[name] else tensor_sha256(reader[name])
        digest.update(f"{name}:{sha};".encode())
    return steps, f"{actors[-1].name}:{digest.hexdigest()[:16]}"


def differences(clean: Record, other: Record) -> list[str]:
    """What differs between two fingerprints, bit for bit (floats compared with ==)."""
    out = []
    if [s["step"] for s in other.steps] != [s["step"] for s in clean.steps]:
        out.append(f"steps {[s['step'] for s in other.steps]} != {[s['step'] for s in clean.steps]}")
    for a, b in zip(clean.steps, other.steps):
        for key in ("reward_mean", "policy_loss", "value_loss"):
            if a[key] != b[key]:
                out.append(f"step {a['step']} {key} {b[key]!r} != {a[key]!r}")
    if other.evals != clean.evals:
        out.append(f"evaluated steps {other.evals} != {clean.evals}")
    if other.checksum != clean.checksum or clean.checksum is None:
        out.append(f"final actor {other.checksum} != {clean.checksum}")
    return out


# --- processes -----------------------------------------------------------------------------


def _cmdline_has(p: psutil.Process, text: str) -> bool:
    try:
        return text in " ".join(p.cmdline())
    except psutil.Error:
        return False


def _summary(run_dir: Path | None) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (TypeError, FileNotFoundError, json.JSONDecodeError):
        return {}


def _events(run_dir: Path, role_dir: str = "") -> list[dict]:
    path = run_dir / "telemetry" / role_dir / "events.jsonl"
    out = []
    for line in (path.read_text().splitlines() if path.is_file() else []):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    return out


def _run_dir(out: Path) -> Path | None:
    dirs = [d for d in out.iterdir() if d.is_dir()] if out.is_dir() else []
    return dirs[0] if dirs else None


def _rollout_started(run_dir: Path, step: int, min_trials: int = 4) -> bool:
    """At least ``min_trials`` trials of ``step`` started on the worker: its requests are in flight."""
    started = [e for e in _events(run_dir, "worker-0") if e.get("name") == "trial.started"
               and str(e.get("trial", "")).startswith(f"st{step}-")]
    return len(started) >= min_trials


def _train_submitted(run_dir: Path, step: int) -> bool:
    return any(e.get("name") == "campaign.train_submitted" and e.get("step") == step for e in _events(run_dir))


def _wait(proc: subprocess.Popen) -> int | None:
    try:
        return proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    finally:
        end_session(proc)


def _inject(proc: subprocess.Popen, out: Path, fault: str, step: int) -> str:
    """Wait until ``fault``'s moment in ``step`` has come, then inject it; returns what it did ("" if
    the run ended first)."""
    if fault == "critic-skip":  # injected inside the run (chaos.critic_skip): the run stops by itself
        return _critic_skip_stopped(proc, out, step)
    when = (lambda d: _train_submitted(d, step)) if fault == "trainer-kill" else (lambda d: _rollout_started(d, step))
    act = {"engine-kill": _kill_engine, "coordinator-kill": _kill_coordinator, "trainer-kill": _kill_trainer}[fault]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline:
        run_dir = _run_dir(out)
        if run_dir is not None and when(run_dir):
            return act(proc, step)
        time.sleep(0.02)
    return ""


def _kill_engine(proc: subprocess.Popen, step: int) -> str:
    engines = sorted((p for p in session_processes(proc) if _cmdline_has(p, "rl.engines.embedded")), key=lambda p: p.pid)
    if not engines:
        return ""
    engines[0].send_signal(signal.SIGKILL)
    return f"engine pid {engines[0].pid} SIGKILLed mid-rollout of step {step}"


def _kill_coordinator(proc: subprocess.Popen, step: int) -> str:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return f"coordinator pid {proc.pid} SIGKILLed mid-rollout of step {step}; resumed"


def _kill_trainer(proc: subprocess.Popen, step: int) -> str:
    # the 1-rank trainer's actor, or (trainer.parallel world size > 1) the last of the rank actors
    ranks = sorted((p for p in session_processes(proc) if _cmdline_has(p, "TrainerHost") or _cmdline_has(p, "TrainerRankHost")),
                   key=lambda p: p.pid)
    if not ranks:
        return ""
    ranks = ranks[-1:]
    ranks[0].send_signal(signal.SIGKILL)
    # a trainer that died mid-step fails the campaign; a coordinator that has not noticed within
    # the limit is ended too (what an operator does before --resume)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
    return f"trainer rank pid {ranks[0].pid} SIGKILLed while training step {step} (run exit {proc.returncode}); resumed"


def _critic_skip_stopped(proc: subprocess.Popen, out: Path, step: int) -> str:
    """Wait for the run with the skipped critic saves to stop; what happened ("" if it did not stop on the
    check after the save of ``step``: the fault did not fire or was not caught)."""
    rc = _wait(proc)
    run_dir = _run_dir(out)
    if run_dir is None or event_since(run_dir, "checkpoint.incomplete", 0.0, step) is None:
        return ""
    return (f"critic save of step {step} skipped silently; CheckpointError at that step (run exit {rc}); "
            "resumed")


# --- the runs ---------------------------------------------------------------------------------
def run_one(name: str, tmp: Path, overrides: list[str], plan: list[tuple[str, int]]) -> Record:
    """One campaign with the faults of ``plan`` ((fault, step) in step order; none: the clean run),
    each crash followed by ``--resume`` of the same run directory."""
    args = [str(CONFIG), *[a for o in overrides for a in ("--set", o)]]
    out, log, t0 = tmp / name, tmp / f"{name}.log", time.monotonic()
    rec, fired = Record(name), []
    first = dict(plan).get("critic-skip")  # the first process carries that fault in it
    proc = start_campaign([*args, "--out", str(out)], log, append=True,
                          entry=("t1ops.cli", "run") if first is None else ("chaos.critic_skip", str(first)))
    try:
        for fault, step in plan:
            what = _inject(proc, out, fault, step)
            fired.append(what or f"{fault} did not fire")
            if not what:
                break
            if fault != "engine-kill":  # the run died: recover by resuming it
                rec.rcs.append(proc.poll())
                end_session(proc)
                proc = start_campaign([*args, "--resume", str(_run_dir(out))], log, append=True)
        rec.rcs.append(_wait(proc))
    finally:
        end_session(proc)
    missed = [f for f in fired if f.endswith("did not fire")] or (["too few"] if len(fired) < len(plan) else [])
    rec.fired = "" if missed else "; ".join(fired)  # "" fails the run: its fault was not injected
    run_dir = _run_dir(out)
    if run_dir is not None:
        rec.steps, rec.checksum = fingerprint(run_dir)
        rec.evals = sorted({e["step"] for e in _summary(run_dir).get("eval", [])})
        rec.run_dir = str(run_dir)
    rec.duration_s = round(time.monotonic() - t0, 1)
    return rec


def verify(tmp: Path, faults: tuple[str, ...] = FAULTS, overrides: list[str] | None = None,
           combined: bool = False) -> tuple[bool, list[Record], str]:
    """Run clean, then each fault in a run of its own (or all of them in one run, ``combined``:
    engine-kill at step 2, coordinator-kill at 3, trainer-kill at 4); returns (every run identical
    to the clean one and every fault fired, the records, the comparison table)."""
    overrides = list(DETERMINISTIC if overrides is None else overrides)
    clean = run_one("clean", tmp, overrides, [])
    if combined:
        steps = {"engine-kill": 2, "coordinator-kill": 3, "trainer-kill": 4}
        plans = {"+".join(faults): [(f, steps[f]) for f in sorted(faults, key=steps.get)]}
    else:
        plans = {f: [(f, KILL_STEP)] for f in faults}
    records = [clean] + [run_one(name, tmp, overrides, plan) for name, plan in plans.items()]
    ok = bool(clean.steps) and clean.rcs == [0]
    for rec in records[1:]:
        ok = ok and bool(rec.fired) and rec.rcs[-1] == 0 and not differences(clean, rec)
    return ok, records, table(records)


def table(records: list[Record]) -> str:
    """The comparison: one column per run, one row per step figure, then the checksum and verdict."""
    clean = records[0]
    cols = [r.name for r in records]
    width = max(34, *(len(c) + 2 for c in cols))
    lines = ["".ljust(LABEL) + "".join(c.ljust(width) for c in cols)]
    for i, s in enumerate(clean.steps):
        for key in ("reward_mean", "policy_loss", "value_loss"):
            cells = []
            for r in records:
                v = r.steps[i][key] if i < len(r.steps) else None
                cells.append(("-" if v is None else f"{v:.10g}") + ("" if v == s[key] else " *"))
            lines.append(f"step {s['step']} {key}".ljust(LABEL) + "".join(c.ljust(width) for c in cells))
    lines.append("final actor".ljust(LABEL) + "".join(
        (str(r.checksum) + ("" if r.checksum == clean.checksum else " *")).ljust(width) for r in records))
    lines.append("exit codes".ljust(LABEL) + "".join(str(r.rcs).ljust(width) for r in records))
    lines.append("duration s".ljust(LABEL) + "".join(str(r.duration_s).ljust(width) for r in records))
    lines.append("verdict".ljust(LABEL) + "".join(
        ("clean" if r is clean else "IDENTICAL" if not differences(clean, r) else "DIFFERS").ljust(width)
        for r in records))
    for r in records[1:]:
        lines.append(f"{r.name}: {r.fired or 'a fault did not fire'}")
        lines += [f"  {d}" for d in differences(clean, r)[:6]]
    return "\n".join(lines)
