"""coordinator-crash: the `t1ops run` process is SIGKILLed mid-step; the campaign resumes.

Fault (real): the walkthrough's recipe (examples/recipes/walkthrough.toml: fully async GRPO on
2 data-parallel trainer ranks with held-out eval), shrunk with ``--set``, runs as its own
`t1ops run` process (its own process session, Ray and engines included). Once step 3 is
recorded and step 4 has been handed to the trainer, the coordinator process gets SIGKILL,
exactly as a node loss or an OOM kill of the head takes it. ``trainer.save_every = 2``, so the
crashed run's newest full checkpoint (both roles, every rank's optimizer and RNG) is step 2:
step 3 published its weights to the engines but wrote no checkpoint (the full checkpoint is
written at ``save_every`` only).

Unguarded: a plain restart (no ``--resume``) starts a new run directory from
step 1 with a fresh warm start: the steps already paid for are lost (the report:
"a crash means restart").

Guarded (``t1ops run CONFIG --resume RUN_DIR``, ``t1ops.campaign.resume``): the
newest step at which actor and trainer state both verify is step 2, the last
save point; the weights and every rank's optimizer state load; step 3's
partial outputs move to ``superseded/``; steps 3-4 run once
more, so summary.json holds steps 1..4, each exactly once, rows 1-2 unchanged.
The async group books balance on both sides of the crash, the groups queued
or generating at the resume point are run again (none lost, none trained
twice; the exactly-once audit of ``t1ops.campaign.group_ledger`` holds), the
group order continues after the resume point, and the resumed run's staleness
headroom is the capacity rule's value.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.procs import end_session, event_since, start_campaign

REPO = Path(__file__).resolve().parents[2]
STEPS, KILL_AT_STEP, SAVE_EVERY = 4, 4, 2
RUN_TIMEOUT_S = 900
RECIPE = REPO / "examples" / "recipes" / "walkthrough.toml"
GROUPS_PER_STEP = 2  # rollout.batch_size / n_samples_per_prompt below
# The walkthrough's recipe (fully async GRPO + DPPO + prompt_mean, 2 data-parallel trainer ranks,
# held-out eval) shrunk with --set to the smallest campaign that still crashes mid-step. The
# zero-variance filter is off: 20 warm-start steps solve nothing, and every group would be dropped.
# Weights move by distributed sync (a gloo group with the engines), as a GPU campaign moves them by
# NCCL: this run is also the combination matrix's cell fully_async x dp=2 x distributed
# (chaos.matrix.STANDS_IN), which the test suite does not run a second time.
OVERRIDES = [f"run.steps={STEPS}", "run.num_cpus=2", f"trainer.save_every={SAVE_EVERY}",
             "engine.weight_sync=distributed",
             "trainer.warm_start_steps=20", "rollout.batch_size=4", "rollout.n_samples_per_prompt=2",
             "rollout.max_turns=1", "rollout.max_new_tokens=24", "fully_async.num_parallel_generation_workers=4",
             "fully_async.zero_variance_filter=false", "eval.every_steps=2", "eval.samples_per_task=1",
             "eval.tasks=['math-add', 'shell-pwd']", "checkpoints.keep_last=3"]


def _args(*extra: str) -> list[str]:
    return [str(RECIPE), *[a for o in OVERRIDES for a in ("--set", o)], *extra]




def _run_to_end(args: list[str], log: Path) -> int:
    proc = start_campaign(args, log)
    try:
        return proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -999
    finally:
        end_session(proc)


def _summary(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"steps": []}


def _submitted(run_dir: Path, step: int) -> bool:
    """The coordinator handed ``step`` to the trainer (its ``campaign.train_submitted`` event)."""
    events = run_dir / "telemetry" / "events.jsonl"
    if not events.is_file():
        return False
    for line in events.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if rec.get("name") == "campaign.train_submitted" and rec.get("step") == step:
            return True
    return False


def _crash_mid_step(out: Path, log: Path, tl: Timeline) -> tuple[Path | None, int | None, dict]:
    """Start the campaign; SIGKILL its coordinator once step KILL_AT_STEP is training (``tl.fault``)."""
    proc = start_campaign(_args("--out", str(out)), log)
    run_dir, deadline = None, time.monotonic() + RUN_TIMEOUT_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            dirs = [d for d in out.iterdir() if d.is_dir()] if out.is_dir() else []
            run_dir = dirs[0] if dirs else None
            if run_dir and len(_summary(run_dir)["steps"]) == KILL_AT_STEP - 1 and _submitted(run_dir, KILL_AT_STEP):
                before = _summary(run_dir)
                tl.fault(at=time.time())  # wall clock: the resumed run's events are timed so
                os.kill(proc.pid, signal.SIGKILL)
                return run_dir, proc.wait(timeout=60), before
            # a tiny step trains in ~0.1-0.3 s on an idle machine: poll often, or the kill lands
            # after the step's checkpoint and there is nothing mid-step left to lose
            time.sleep(0.01)
        return run_dir, proc.poll(), _summary(run_dir) if run_dir else {}
    finally:
        if proc.poll() is None:
            proc.kill()
        end_session(proc)


@register("coordinator-crash", "the coordinator is SIGKILLed mid-step; resume continues the same run")
def run(tmp: Path) -> Outcome:
    tl = Timeline()
    run_dir, rc, before = _crash_mid_step(tmp / "runs", tmp / "crash.log", tl)
    steps_before = [r["step"] for r in before.get("steps", [])]
    fault_fired = rc == -signal.SIGKILL and steps_before == list(range(1, KILL_AT_STEP))
    details: dict = {"crash_rc": rc, "steps_before_crash": steps_before, "crash_log_tail": _tail(tmp / "crash.log")}
    if not fault_fired or run_dir is None:
        return Outcome(fault_fired=False, unguarded="", guarded=Guarded(caught=False, error="no crash"),
                       details=details)

    # Guarded: resume the crashed run (the same recipe and overrides: a resume refuses another config).
    t0 = time.monotonic()
    rc_resume = _run_to_end(_args("--resume", str(run_dir)), tmp / "resume.log")
    detection_s = time.monotonic() - t0
    after = _summary(run_dir)
    tl.after_fault(detected=event_since(run_dir, "campaign.resume_point", tl.marks["fault"]),
                   healthy=event_since(run_dir, "campaign.sync_done", tl.marks["fault"]))  # resumed run's first

    # Unguarded: a plain restart starts a new run from step 1; the crashed run's steps are not continued.
    # (Only its first step is run, on a short warm start without eval: all it has to show is where it begins.)
    rc_plain = _run_to_end(_args("--out", str(tmp / "restart"), "--steps", "1", "--set", "trainer.warm_start_steps=2",
                                 "--set", "eval.every_steps=0"), tmp / "restart.log")
    plain_dirs = list((tmp / "restart").iterdir()) if (tmp / "restart").is_dir() else []
    plain = _summary(plain_dirs[0]) if plain_dirs else {"steps": []}
    plain_steps = [r["step"] for r in plain["steps"]]
    lost = rc_plain == 0 and plain_steps == [1] and plain_dirs[0] != run_dir and bool(plain.get("warm_start_loss"))

    log = (tmp / "resume.log").read_text()
    steps_after = [r["step"] for r in after["steps"]]
    resumes = after.get("resumes", [])
    same_prefix = [r["reward_mean"] for r in after["steps"][:SAVE_EVERY]] == \
        [r["reward_mean"] for r in before["steps"][:SAVE_EVERY]]
    actor = sorted(p.name for p in (run_dir / "checkpoints" / "actor").glob("step_*"))
    books = _async_books(after)
    invariants = {
        "unguarded_restart_loses_the_steps": lost,
        "resume_exit_0": rc_resume == 0,
        "no_step_lost_or_repeated": steps_after == list(range(1, STEPS + 1)),
        "rows_before_resume_point_unchanged": same_prefix,
        "picked_last_save_point_and_said_so": bool(resumes) and resumes[-1]["from_step"] == SAVE_EVERY
        and f"resuming from step {SAVE_EVERY}" in log,
        "full_checkpoint_only_at_save_every": all(int(a[len("step_"):]) % SAVE_EVERY == 0 for a in actor),
        "weights_and_every_ranks_state_loaded": "loaded and verified" in log and "RNG of 2 ranks" in log,
        "step_run_again_superseded": bool(resumes) and resumes[-1]["steps_run_again"] == [KILL_AT_STEP - 1]
        and resumes[-1]["superseded"] is not None and Path(resumes[-1]["superseded"]).is_dir(),
        "reward_curve_continues": all(r.get("num_trajectories", 0) > 0 for r in after["steps"]),
        "final_checkpoint_written": f"step_{STEPS:08d}" in actor,
        "held_out_eval_across_the_crash": sorted({e["step"] for e in after.get("eval", [])}) == [0, 2, 4],
        **books["invariants"],
    }
    details.update(steps_after_resume=steps_after, resume=resumes[-1] if resumes else None,
                   plain_restart_steps=plain_steps, resume_log_tail=_tail(tmp / "resume.log"),
                   actor_checkpoints=actor, async_books=books["figures"])
    caught = rc_resume == 0 and invariants["no_step_lost_or_repeated"]
    return Outcome(
        fault_fired=True,
        unguarded=f"coordinator SIGKILLed during step {KILL_AT_STEP} after {len(steps_before)} steps; a plain "
                  f"restart began a new run at step 1 (steps {plain_steps}, a fresh warm start): the "
                  f"{len(steps_before)} completed steps were lost",
        guarded=Guarded(caught=caught, detection_s=detection_s,
                        error=(resumes[-1]["message"] if resumes else
                               f"no resume recorded (resume exit {rc_resume}; its log ends: "
                               + " | ".join(_tail(tmp / "resume.log", 6)) + ")")
                        + f"; summary steps after resume {steps_after}"),
        invariants=invariants, details=details,
        recovery=tl.recovery(steps_lost=len(resumes[-1]["steps_run_again"]) if resumes else 0,
                             how="`t1ops run --resume` started at once; healthy: its first step synced"))


def _async_books(after: dict) -> dict:
    """The fully async group books across the crash: accepted, trained, dropped and in-flight groups
    balance on each side of it, no group is trained twice, and the resumed run's staleness headroom
    is the capacity rule's value at its first step, (max_staleness + 1) x groups per step."""
    rows = after.get("steps", [])
    resumed = (after.get("async_resumes") or [{}])[-1]
    at_crash = resumed.get("books_at_resume_point", {})
    final = after.get("async_books", {})
    trained_ids = [g for r in rows for g in r.get("group_lags", {})]
    run_again = set(resumed.get("run_again", []))
    index = [int(g.split("-", 1)[0][2:]) for r in rows if r["step"] > SAVE_EVERY for g in r.get("group_lags", {})
             if g not in run_again]  # new groups: the order continues
    settled = ("accepted", "zero_variance", "failed", "cancelled")
    figures = {"at_resume_point": at_crash, "lost_in_crash": resumed.get("lost_in_crash"), "final": final,
               "trained": len(trained_ids), "run_again": sorted(run_again), "audit": after.get("group_audit"),
               "headroom": resumed.get("headroom"),
               "headroom_rule": resumed.get("headroom_rule")}
    invariants = {
        "books_balance_before_and_after_the_crash": bool(at_crash) and bool(final)
        and at_crash["submitted"] == sum(at_crash[k] for k in settled) + at_crash["running"]
        and final["submitted"] == sum(final[k] for k in settled) + final["running"] and final["balanced"],
        "accepted_equals_trained_plus_queued": bool(at_crash)
        and at_crash["accepted"] == at_crash["trained"] + at_crash["dropped_from_batch"] + at_crash["queued"],
        "queued_and_generating_groups_run_again_none_lost": resumed.get("lost_in_crash") == 0
        and len(run_again) == at_crash.get("running", -1) + at_crash.get("queued", -1)
        and (after.get("group_audit") or {}).get("ok") is True,
        "every_step_trained_its_groups_once": len(trained_ids) == len(set(trained_ids)) == STEPS * GROUPS_PER_STEP,
        "resumed_group_order_continues": bool(index) and bool(at_crash) and min(index) >= at_crash["planner_next"],
        "staleness_headroom_after_resume_is_the_rule": resumed.get("headroom") is not None
        and resumed["headroom"] == resumed["headroom_rule"] == 2 * GROUPS_PER_STEP,
    }
    return {"invariants": invariants, "figures": figures}


def _tail(path: Path, n: int = 12) -> list[str]:
    try:
        return path.read_text().splitlines()[-n:]
    except FileNotFoundError:
        return []
