"""staleness-after-recovery: a resumed run's staleness budget is inflated, stale groups get trained.

AReaL #1345 (github.com/areal-project/AReaL/pull/1345): after a recovery the policy version jumps
from 0 to the recovered version while the staleness manager's ``accepted`` counter starts from 0, so
the capacity rule ``(max_staleness + version) x B - (accepted + running)`` grants ``version x B``
extra groups and generation runs further ahead of training than ``max_staleness`` allows.

Fault (real): the fully_async bookkeeping of resume-drops-buffered (the real ``GroupBuffer``,
``GroupPlanner`` and step rows) is SIGKILLed mid-step 3 and resumed at step 2. The recovery restores
the version counter into the staleness manager (``StalenessManager(current_step=3)``, the public
constructor, as the recovered trainer's version) but not ``accepted``: the budget is inflated by
2 steps' groups.

Unguarded (the resume as AReaL did it before the fix, no budget check): generation starts groups
ahead of the rule and a group older than ``max_staleness`` is trained (its lag in the row's
``group_lags``, a violation counted).

Guarded: (1) ``GroupBuffer.check_budget`` after every weight sync (``AsyncSource.after_sync``)
names the inflated budget at the resumed run's first sync, before any stale group is trained;
(2) the production resume derives the counters from the rule at the resumed version
(``StalenessManager.resumed``): its headroom is ``(max_staleness + 1) x B``, the groups queued or
generating at the crash are run again as new groups (never restored with their old tags), and no
group trained after the resume is older than ``max_staleness``.
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.scenarios.resume_drops_buffered import (GROUPS, MAX_STALENESS, RESUME_AT, WORKERS, async_steps, crash,
                                                   new_async, resumed)
from rl.staleness import CapacityError, StalenessManager
from t1ops.campaign.group_ledger import replay_plan


def _inflated(gen) -> None:
    """The recovery as it was: the version counter restored, ``accepted`` (and ``running``) from 0."""
    gen.buffer.manager = StalenessManager(max_staleness=MAX_STALENESS, batch_size=GROUPS, max_concurrency=WORKERS,
                                          current_step=RESUME_AT + 1)


def _resume(crashed: dict, run_dir: Path, *, inflate: bool, check: bool) -> tuple[dict, object, Exception | None]:
    summary, first = resumed(crashed, run_dir), RESUME_AT + 1
    start, replay = replay_plan(summary.steps, RESUME_AT)
    gen = new_async(first, start, replay)
    if inflate:
        _inflated(gen)
    headroom = gen.buffer.manager.headroom()
    try:
        async_steps(summary, gen, first, check_budget=check)
        err = None
    except CapacityError as e:
        err = e
    final = json.loads((run_dir / "summary.json").read_text())
    return {"final": final, "headroom_at_resume": headroom, "replay": replay}, gen, err


def _after(final: dict) -> list[dict]:
    return [r for r in final["steps"] if r["step"] > RESUME_AT]


@register("staleness-after-recovery", "a resumed run's staleness budget is inflated and stale groups get trained")
def run(tmp: Path) -> Outcome:
    rc, crashed, _ = crash("fully_async", tmp / "crashed")
    fault_fired = rc == -signal.SIGKILL and [r["step"] for r in crashed.get("steps", [])] == list(range(1, RESUME_AT + 1))
    rule = (MAX_STALENESS + 1) * GROUPS
    details: dict = {"exit_code": rc, "headroom_rule": rule}
    if not fault_fired:
        return Outcome(fault_fired=False, unguarded="", guarded=Guarded(caught=False, error="no kill"), details=details)

    plain, _, plain_err = _resume(crashed, tmp / "unguarded", inflate=True, check=False)
    stale = {g: lag for r in _after(plain["final"]) for g, lag in r["group_lags"].items() if lag > MAX_STALENESS}

    t0 = time.monotonic()
    named, _, named_err = _resume(crashed, tmp / "detected", inflate=True, check=True)
    detection_s = time.monotonic() - t0
    tl = Timeline()  # from the resume with the inflated budget: stopped at its first sync; the right resume runs
    tl.fault(at=t0)
    if isinstance(named_err, CapacityError):
        tl.after_fault(detected=detection_s, stopped=detection_s)
    good, gen, good_err = _resume(crashed, tmp / "guarded", inflate=False, check=True)
    if good_err is None:
        tl.healthy()
    lags = [lag for r in _after(good["final"]) for lag in r["group_lags"].values()]
    replayed_lags = {g: lag for r in _after(good["final"]) for g, lag in r["group_lags"].items() if g in good["replay"]}
    invariants = {
        "fault_inflates_the_budget": plain["headroom_at_resume"] > rule,
        "unguarded_group_beyond_max_staleness_trained": plain_err is None and bool(stale),
        "inflated_budget_caught_at_the_first_sync": isinstance(named_err, CapacityError)
        and "staleness budget inflated" in str(named_err) and "StalenessManager.resumed" in str(named_err)
        and [r["step"] for r in named["final"]["steps"]] == list(range(1, RESUME_AT + 1)),
        "no_stale_group_trained_before_the_catch": not any(
            lag > MAX_STALENESS for r in _after(named["final"]) for lag in r["group_lags"].values()),
        "guarded_headroom_is_the_rule": good_err is None and good["headroom_at_resume"] == rule,
        "guarded_no_group_beyond_max_staleness": bool(lags) and max(lags) <= MAX_STALENESS
        and sum(r["staleness_violations"] for r in _after(good["final"])) == 0,
        "buffered_groups_rerun_fresh_not_restored_stale": bool(good["replay"])
        and set(replayed_lags) == set(good["replay"]) and max(replayed_lags.values()) <= MAX_STALENESS,
        "guarded_books_balance": good["final"]["async_books"]["balanced"],
    }
    details.update(headroom_unguarded=plain["headroom_at_resume"], headroom_guarded=good["headroom_at_resume"],
                   stale_trained=stale, guarded_lags=lags, replayed_lags=replayed_lags,
                   manager_after=gen.buffer.manager.stats())
    return Outcome(
        fault_fired=True,
        unguarded=f"resumed at step {RESUME_AT} with the version restored but not accepted: headroom "
                  f"{plain['headroom_at_resume']} groups (rule {rule}); groups trained "
                  f"{sorted(set(stale.values()))} steps old (max_staleness {MAX_STALENESS}): {sorted(stale)}, no error",
        guarded=Guarded(caught=invariants["inflated_budget_caught_at_the_first_sync"], detection_s=detection_s,
                        error=str(named_err)[:300] if named_err else "not caught"),
        invariants=invariants, details=details,
        recovery=tl.recovery(how="stopped with CapacityError at the first sync; the resume with the rule's "
                                 "headroom (runbook) ran to the last step"))
