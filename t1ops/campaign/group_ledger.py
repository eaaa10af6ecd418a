"""Every prompt group trained exactly once across a resume, in every mode (docs/async.md, "Resume").

What a resume at step S must do with the groups the crashed run had *generated but not trained*:

- sync: nothing is buffered across a step (the batch is generated, trained, synced); the data
  position is a pure function of the step (``t1ops.campaign.worker.plan_groups``), so resuming
  at S + 1 regenerates exactly the groups of the steps that run again.
- one_step: batch S + 1 was generating while step S trained. It is drained before every weight
  sync and was never trained by a kept step; the resume submits S + 1 again (same group ids).
- fully_async: the queue and the in-flight groups at row S (``async_books["pending"]``) are
  neither trained by a kept step nor re-planned by the group order, which continues at
  ``planner_next``. The resume runs them again first (:func:`replay_plan`), under their own
  ids; dropping them loses those prompts for good (OpenRLHF issue #1322; a NeMo-RL resume lost
  736 prompts, ~30%).

:func:`audit_groups` proves it at the end of every run from summary.json alone: no group id is
trained twice, every step appears once, and (fully_async) every group the order handed out is
trained, dropped with its reason, or still pending at the end. A resume that lost groups is an
error event naming them (runbooks/resume-drops-buffered.md).
"""
from __future__ import annotations

import re
from collections import Counter

from t1ops.errors import ConfigError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "resume-drops-buffered": ("run.mode", "trainer.save_every", "fully_async.max_staleness_steps",
                              "fully_async.num_parallel_generation_workers"),
}

_ASYNC_ID = re.compile(r"^ag(\d+)-(.+)$")


def async_index(group_id: str) -> tuple[int, str]:
    """(position in the group order, task) of a fully_async group id ``ag<k>-<task>``."""
    m = _ASYNC_ID.match(group_id)
    if m is None:
        raise ConfigError(f"{group_id!r} is not a fully_async group id (ag<k>-<task>)", key="run.mode")
    return int(m.group(1)), m.group(2)


def replay_plan(rows: list[dict], step: int) -> tuple[int, list[str]]:
    """(where the group order continues, the group ids to run again first) for a fully_async run
    resumed at ``step``: the groups queued or generating at that step's row."""
    books = [r["async_books"] for r in rows if r["step"] == step and "async_books" in r]
    if not books:
        raise ConfigError(f"resuming a fully_async run at step {step}: its summary row has no async_books "
                          "(written by an older t1ops), so the groups it had generated but not trained "
                          "cannot be run again; start a new run", key="run.mode")
    book = books[-1]
    if "pending" not in book:
        raise ConfigError(f"resuming a fully_async run at step {step}: its row's async_books do not name the "
                          f"{book.get('running', 0) + book.get('queued', 0)} groups queued or generating "
                          "(written by an older t1ops); resuming would drop them silently. Start a new run",
                          key="run.mode")
    return int(book["planner_next"]), list(book["pending"])


def audit_groups(summary: dict, mode: str) -> dict:
    """Exactly-once books of a finished run from its summary (rows after any resume included)."""
    rows = summary.get("steps", [])
    steps = Counter(r["step"] for r in rows)
    trained = [g for r in rows for g in _trained(r, mode)]
    twice = sorted(g for g, n in Counter(trained).items() if n > 1)
    problems = [f"step {s} recorded {n} times" for s, n in sorted(steps.items()) if n > 1]
    if rows and sorted(steps) != list(range(1, max(steps) + 1)):
        problems.append(f"steps missing: {sorted(set(range(1, max(steps) + 1)) - set(steps))}")
    if twice:
        problems.append(f"{len(twice)} groups trained twice: {twice[:8]}")
    out = {"mode": mode, "steps": len(steps), "trained": len(trained), "trained_twice": twice}
    if mode == "fully_async":
        dropped = [g for r in rows for g in r.get("groups_dropped_ids", [])]
        left = list((summary.get("async_books") or {}).get("left_ids", []))
        last = next((r["async_books"] for r in reversed(rows) if "async_books" in r), {})
        handed = int((summary.get("async_books") or {}).get("planner_next", last.get("planner_next", 0)))
        seen = {async_index(g)[0] for g in (*trained, *dropped, *left)}
        lost = sorted(set(range(handed)) - seen)
        if lost:
            problems.append(f"{len(lost)} of {handed} groups handed out were never trained, dropped or left "
                            f"pending (lost, e.g. across a resume): positions {lost[:12]}")
        out.update(dropped=len(dropped), left=len(left), handed_out=handed, lost=lost)
    else:
        outside = [g for r in rows for g in _trained(r, mode) if not g.startswith(f"st{r['step']}-")]
        if outside:
            problems.append(f"{len(outside)} groups trained in a step that did not plan them: {outside[:8]}")
    out.update(ok=not problems, problems=problems)
    return out


def _trained(row: dict, mode: str) -> list[str]:
    if mode == "fully_async":
        return list(row.get("group_lags", {}))
    return list(row.get("group_ids", []))


def trained_group_ids(results: list) -> list[str]:
    """The distinct group ids of a step's trained results (TrialResult), in order (sync and one_step rows)."""
    return list(dict.fromkeys(r.group_id for r in results))
