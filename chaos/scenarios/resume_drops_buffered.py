"""resume-drops-buffered: a resume silently skips the groups generated but not yet trained.

OpenRLHF issue #1322 (a NeMo-RL resume lost 736 prompts, ~30%): the checkpoint keeps the
data position *after* every generated prompt while the buffer of generated-but-untrained
rollouts starts empty, so those prompts are never trained.

Fault (real): in each mode (sync, one_step, fully_async) a coordinator process runs the
production step bookkeeping with real groups: the real batch source (``PipelinedSource``, whose
generation is the campaign's data order ``plan_groups``; fully_async: the real ``GroupBuffer`` and
``GroupPlanner`` with its staleness slots), the real step rows (``step_accounting``, ``row_books``)
written to summary.json by ``Summary``. Mid-step ``RESUME_AT + 1`` (the batch taken, the next
groups generating or queued) the process gets SIGKILL: no cleanup, summary.json holds rows up to
``RESUME_AT`` (the newest trainer state, ``trainer.save_every``). The generation side is in process
(no engines): groups finish oldest first, so every run is the same, and what a kill leaves on disk
is exactly what a resume of a real campaign has (coordinator-crash proves the same end to end on
the walkthrough recipe, with Ray and engines).

Unguarded (fully_async, the resume before this guard): the group order continues at the resume
row's ``planner_next`` and the buffer starts empty; the groups queued or generating at that row
are never trained. The exactly-once audit (``t1ops.campaign.group_ledger.audit_groups``, run at
the end of every campaign) names them by position.

Guarded (``t1ops.campaign.group_ledger.replay_plan``): the resume runs those groups again first,
under their own ids, then continues the order. In every mode the audit holds: each step once,
no group trained twice, every group handed out trained, dropped with its reason, or left pending
at the end; the books (submitted = settled + running; accepted = trained + dropped + queued)
balance across the crash.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from t1ops.campaign.async_buffer import GroupBuffer
from t1ops.campaign.async_loop import GroupPlanner, end_books, row_books, step_accounting
from t1ops.campaign.group_ledger import audit_groups, replay_plan
from t1ops.campaign.resume import ResumePoint, resumed_summary
from t1ops.campaign.rollouts import Pending, PipelinedSource
from t1ops.campaign.summary import Summary
from t1ops.campaign.trials import GroupResult, TrialResult
from t1ops.campaign.worker import plan_groups

TASKS = [f"task-{i}" for i in range(7)]
SEED, STEPS, RESUME_AT = 0, 5, 2  # rows 1..2 persist; step 3 is killed mid-step
GROUPS, SAMPLES, MAX_STALENESS, WORKERS = 2, 2, 1, 4
MODES = ("sync", "one_step", "fully_async")


def _rewards(gid: str) -> list[float]:
    """Fixed, varied rewards; every fifth group all-equal (zero variance: dropped and counted)."""
    h = sum(map(ord, gid))
    return [1.0] * SAMPLES if h % 5 == 0 else [((h + s) % 3) / 2 for s in range(SAMPLES)]


def _results(gid: str, task: str, version: int) -> list[TrialResult]:
    return [TrialResult(group_id=gid, task=task, trial_id=f"{gid}-s{s}", sample_id=f"{gid}-s{s}", reward=r,
                        loss_versions={version: 4}) for s, r in enumerate(_rewards(gid))]


def _group(gid: str, task: str, tag: int) -> GroupResult:
    """A finished group as ``RolloutWorker.rollout_group`` returns it."""
    results = _results(gid, task, tag - 1)
    n = len(results)
    return GroupResult(group_id=gid, task=task, started_step=tag, results=results, failed={}, node="local",
                       ledger={"expected": n, "completed": n, "failed": 0, "cancelled": 0, "missing": 0},
                       duration_s=0.0)


def _row(step: int, results: list[TrialResult], fields: dict) -> dict:
    rewards = [r.reward for r in results]
    return {"step": step, "reward_mean": sum(rewards) / max(1, len(rewards)), "explained_variance": 0.0,
            "logprob_gap": 0.0, "turns_mean": 1.0, "tokens": 4 * len(results), "rollout_s": 0.0, "train_s": 0.0,
            "step_s": 0.0, **fields}


# --- fully_async ----------------------------------------------------------------------------
class AsyncGen:
    """The generation side of the fully async loop in process: groups start through the real buffer's
    staleness slots and the real group order, and finish oldest first, one per poll."""

    def __init__(self, buffer: GroupBuffer, planner: GroupPlanner) -> None:
        self.buffer, self.planner = buffer, planner
        self.in_flight: dict[str, tuple[int, str]] = {}  # group id -> (started step, task)

    def fill(self) -> None:
        while (tag := self.buffer.try_start()) is not None:
            specs = self.planner.next_group()
            self.in_flight[specs[0].group_id] = (tag, specs[0].task)

    def poll(self) -> None:
        if self.in_flight:
            gid = next(iter(self.in_flight))
            tag, task = self.in_flight.pop(gid)
            self.buffer.on_done(_group(gid, task, tag), tag)
        self.fill()

    def stop(self) -> dict:
        for gid, (tag, _) in list(self.in_flight.items()):  # stopped at the end: cancelled, by id
            self.buffer.on_done(None, tag, cancelled=True, group_id=gid)
        self.in_flight.clear()
        return end_books(self.buffer, self.planner)


def async_steps(summary: Summary, gen: AsyncGen, first: int, crash_step: int | None = None,
                polls_while_training: int = 1, note: Path | None = None, check_budget: bool = True) -> None:
    """fully_async steps ``first``..STEPS as ``AsyncSource`` takes them (batch, train while generating,
    sync, row, fill); SIGKILL mid-step ``crash_step`` after writing what was in flight to ``note``."""
    buffer = gen.buffer
    gen.fill()
    for step in range(first, STEPS + 1):
        while not buffer.batch_ready():
            gen.poll()
        groups = buffer.take_batch()
        for _ in range(polls_while_training):  # generation goes on while the step trains
            gen.poll()
        if step == crash_step:
            note.write_text(json.dumps({"taken": [g.group_id for g in groups], "queued": buffer.queued_ids(),
                                        "in_flight": list(gen.in_flight)}))
            os.kill(os.getpid(), signal.SIGKILL)
        buffer.advance()
        if check_budget:  # AsyncSource.after_sync
            buffer.check_budget()
        results = [r for g in groups for r in g.data.results]
        fields = step_accounting(buffer, groups, results, step, 1.0)
        fields["async_books"] = row_books(buffer, gen.planner, list(gen.in_flight))
        summary.add_step(_row(step, results, fields))
        gen.fill()
    summary.extra["async_books"] = gen.stop()
    summary.save()


def new_async(first: int = 1, start: int = 0, replay: list[str] | None = None) -> AsyncGen:
    buffer = GroupBuffer(groups_per_step=GROUPS, group_size=SAMPLES, max_staleness=MAX_STALENESS,
                         num_workers=WORKERS, first_step=first)
    return AsyncGen(buffer, GroupPlanner(TASKS, SAMPLES, SEED, start, replay))


# --- sync and one_step ------------------------------------------------------------------------
class LocalRollouts:
    """Generation for the real ``PipelinedSource`` in process: each step's groups are the campaign's
    data order (``plan_groups``); a submitted batch is generating until it is collected."""

    in_flight = 0

    def __init__(self) -> None:
        self.submitted: list[int] = []

    def submit(self, step: int) -> Pending:
        groups, accept = plan_groups(TASKS, step, GROUPS * SAMPLES, SAMPLES, SEED)
        self.submitted.append(step)
        return Pending(step, groups[:accept], accept * SAMPLES)

    def collect(self, pending: Pending) -> tuple[list[TrialResult], float, dict]:
        results = [r for g in pending.refs for r in _results(g[0].group_id, g[0].task, pending.step - 1)]
        n = len(results)
        return results, 0.0, {"expected": n, "completed": n, "failed": 0, "cancelled": 0, "missing": 0}

    def check_workers(self) -> list[int]:
        return []

    def wait_done(self, pending: Pending) -> None:
        pending.done_at = time.monotonic()


def pipelined_steps(summary: Summary, mode: str, first: int, crash_step: int | None = None,
                    note: Path | None = None) -> None:
    """sync / one_step steps through the real ``PipelinedSource`` as ``take_step`` drives it."""
    rollouts = LocalRollouts()
    source = PipelinedSource(rollouts, pipelined=mode == "one_step", steps=STEPS)
    source.start(first, summary)
    for step in range(first, STEPS + 1):
        batch = source.take(step, None)
        if step == crash_step:
            generating = source.pending.step if source.pending is not None else None
            note.write_text(json.dumps({"taken": sorted({r.group_id for r in batch.results}),
                                        "submitted_steps": rollouts.submitted, "generating_step": generating}))
            os.kill(os.getpid(), signal.SIGKILL)
        source.before_sync()
        summary.add_step(_row(step, batch.results, source.row_fields(step, batch)))
    source.stop(summary)


def planned_ids(step: int) -> list[str]:
    groups, accept = plan_groups(TASKS, step, GROUPS * SAMPLES, SAMPLES, SEED)
    return [g[0].group_id for g in groups[:accept]]


# --- crash and resume ---------------------------------------------------------------------------
def _child(mode: str, run_dir: str) -> None:
    summary = Summary(Path(run_dir), "crashed", {"run": {"mode": mode}})
    note = Path(run_dir) / "at-kill.json"
    if mode == "fully_async":
        async_steps(summary, new_async(), 1, crash_step=RESUME_AT + 1, note=note)
    else:
        pipelined_steps(summary, mode, 1, crash_step=RESUME_AT + 1, note=note)


def crash(mode: str, run_dir: Path) -> tuple[int | None, dict, dict]:
    """Run ``mode`` in its own process until it is SIGKILLed mid-step; (exit code, summary, at-kill note)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(mode, str(run_dir)), daemon=True)
    proc.start()
    proc.join(120)
    if proc.is_alive():
        proc.kill()
        proc.join(10)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    note = json.loads((run_dir / "at-kill.json").read_text()) if (run_dir / "at-kill.json").is_file() else {}
    return proc.exitcode, summary, note


def resumed(crashed: dict, run_dir: Path) -> Summary:
    """A new run directory holding the crashed run's summary resumed at RESUME_AT (``resumed_summary``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = Summary(run_dir, "resumed", crashed.get("config", {}))
    point = ResumePoint(RESUME_AT, list(range(RESUME_AT + 1)), [], list(range(RESUME_AT + 1)))
    resumed_summary(summary, dict(crashed), point)
    return summary


def _resume(mode: str, crashed: dict, run_dir: Path, guarded: bool, tl: Timeline | None = None) -> dict:
    """Resume ``mode`` from the crashed summary; ``tl``: fault at the resume's start (the crashed state
    loaded), detected when the replay plan names the buffered groups, healthy once the run is done."""
    tl = tl or Timeline()
    tl.fault()
    summary, first = resumed(crashed, run_dir), RESUME_AT + 1
    if mode == "fully_async":
        if guarded:
            start, replay = replay_plan(summary.steps, RESUME_AT)
            tl.detected()
        else:  # the resume before the guard: the order continues, the buffer starts empty
            start, replay = summary.steps[-1]["async_books"]["planner_next"], []
        async_steps(summary, new_async(first, start, replay), first)
    else:
        pipelined_steps(summary, mode, first)
    tl.healthy()
    return json.loads((run_dir / "summary.json").read_text())


def _checks(mode: str, final: dict, audit: dict, crashed: dict) -> dict[str, bool]:
    rows = final["steps"]
    if mode != "fully_async":
        return {f"{mode}_every_planned_group_trained_once": [r["group_ids"] for r in rows]
                == [planned_ids(s) for s in range(1, STEPS + 1)]}
    pending = crashed["steps"][-1]["async_books"]["pending"]
    after = [g for r in rows if r["step"] > RESUME_AT for g in (*r["group_lags"], *r["groups_dropped_ids"])]
    left = final["async_books"]["left_ids"]
    books = final["async_books"]
    settled = sum(books[k] for k in ("accepted", "zero_variance", "failed", "cancelled"))
    trained = sum(len(r["group_lags"]) for r in rows if r["step"] > RESUME_AT)
    return {
        "fully_async_buffered_groups_run_again_once": bool(pending)
        and all((after + left).count(g) == 1 for g in pending),
        "fully_async_books_balance": books["balanced"] and books["submitted"] == settled + books["running"]
        and books["accepted"] == books["trained"] + books["dropped_from_batch"] + books["queued"]
        and books["trained"] == trained,
        "fully_async_handed_out_equals_trained_dropped_left": audit["handed_out"]
        == audit["trained"] + audit["dropped"] + audit["left"],
    }


@register("resume-drops-buffered", "a resume silently skips the groups generated but not yet trained")
def run(tmp: Path) -> Outcome:
    crashes = {m: crash(m, tmp / f"{m}-crashed") for m in MODES}
    fired = {m: rc == -signal.SIGKILL and [r["step"] for r in s.get("steps", [])] == list(range(1, RESUME_AT + 1))
             and bool(note) for m, (rc, s, note) in crashes.items()}
    details: dict = {"at_kill": {m: c[2] for m, c in crashes.items()}, "exit_codes": {m: c[0] for m, c in crashes.items()}}
    if not all(fired.values()):
        return Outcome(fault_fired=False, unguarded="", guarded=Guarded(caught=False, error=f"no kill: {fired}"),
                       details=details)
    async_crashed = crashes["fully_async"][1]
    pending = async_crashed["steps"][-1]["async_books"]["pending"]

    # Unguarded: the fully_async resume without the replay (order continues, buffer empty).
    t0 = time.monotonic()
    plain = _resume("fully_async", async_crashed, tmp / "fully_async-unguarded", guarded=False)
    plain_audit = audit_groups(plain, "fully_async")
    detection_s = time.monotonic() - t0
    lost_ids = sorted(f"ag{k}" for k in plain_audit.get("lost", []))
    handed = plain_audit.get("handed_out", 0)

    # Guarded: every mode resumes; the audit holds.
    invariants: dict[str, bool] = {
        "unguarded_resume_loses_the_buffered_groups": not plain_audit["ok"]
        and lost_ids == sorted(g.split("-", 1)[0] for g in pending) and len(pending) > 0,
        "unguarded_loss_named_by_the_audit": any("never trained, dropped or left" in p for p in plain_audit["problems"]),
    }
    audits, tl = {}, Timeline()
    for mode in MODES:
        final = _resume(mode, crashes[mode][1], tmp / f"{mode}-guarded", guarded=True,
                        tl=tl if mode == "fully_async" else None)
        audits[mode] = audit = audit_groups(final, mode)
        invariants[f"{mode}_exactly_once_audit_holds"] = audit["ok"] and audit["steps"] == STEPS
        invariants.update(_checks(mode, final, audit, crashes[mode][1]))
    invariants["one_step_in_flight_batch_generated_again"] = crashes["one_step"][2].get("generating_step") \
        == RESUME_AT + 2 and RESUME_AT + 1 in crashes["one_step"][2].get("submitted_steps", [])
    details.update(pending_at_resume_point=pending, unguarded_audit=plain_audit, guarded_audits=audits)
    caught = invariants["unguarded_loss_named_by_the_audit"] and all(a["ok"] for a in audits.values())
    return Outcome(
        fault_fired=True,
        unguarded=f"fully_async resume at step {RESUME_AT} without the buffered groups: {len(lost_ids)} of "
                  f"{handed} groups handed out were never trained ({', '.join(lost_ids)}: queued or generating "
                  "at the resume point), and no error",
        guarded=Guarded(caught=caught, detection_s=detection_s,
                        error="; ".join(plain_audit["problems"]) + f"; guarded resumes: " + ", ".join(
                            f"{m} {a['trained']} groups trained once" for m, a in audits.items())),
        invariants=invariants, details=details,
        recovery=tl.recovery(how=f"resume (fully_async): {len(pending)} buffered groups replayed, none lost; "
                                 "from the resumed state's load to its last step"))
