"""Exactly-once group books across a resume (t1ops.campaign.group_ledger) and the resumed
staleness budget (rl.staleness.StalenessManager.resumed / check_budget)."""
from __future__ import annotations

import pytest

from rl.staleness import CapacityError, StalenessManager
from t1ops.campaign.async_buffer import GroupBuffer
from t1ops.campaign.async_loop import GroupPlanner, end_books, row_books
from t1ops.campaign.group_ledger import async_index, audit_groups, replay_plan
from t1ops.errors import ConfigError
from tests.t1ops.results import group


def _group(gid: str):
    return group(gid, [0.0, 1.0])


def test_planner_runs_the_pending_groups_again_first_under_their_ids():
    p = GroupPlanner(["a", "b", "c"], 2, seed=0, start=5, replay=["ag3-b", "ag4-c"])
    ids = [p.next_group()[0].group_id for _ in range(3)]
    assert ids[:2] == ["ag3-b", "ag4-c"] and ids[2].startswith("ag5-") and p.next_index == 6
    assert [s.task for s in GroupPlanner(["a"], 2, 0, replay=["ag9-x-y"]).next_group()] == ["x-y", "x-y"]
    assert async_index("ag12-task-1") == (12, "task-1")


def test_row_books_name_the_pending_groups_and_replay_plan_reads_them():
    buf = GroupBuffer(groups_per_step=1, group_size=2, max_staleness=1, num_workers=4)
    p = GroupPlanner(["a", "b"], 2, seed=0)
    started = {p.next_group()[0].group_id: buf.try_start() for _ in range(2)}
    first, second = started
    buf.on_done(_group(first), 1)
    book = row_books(buf, p, in_flight=[second])
    assert book["pending"] == [first, second] and book["planner_next"] == 2
    assert replay_plan([{"step": 4, "async_books": book}], 4) == (2, [first, second])
    with pytest.raises(ConfigError, match="do not name"):
        replay_plan([{"step": 4, "async_books": {"running": 1, "queued": 1, "planner_next": 2}}], 4)
    with pytest.raises(ConfigError, match="no async_books"):
        replay_plan([{"step": 3}], 4)


def test_audit_names_lost_and_twice_trained_groups():
    rows = [{"step": 1, "group_lags": {"ag0-a": 0, "ag1-b": 0}, "groups_dropped_ids": ["ag2-c"]},
            {"step": 2, "group_lags": {"ag4-a": 0, "ag5-b": 1}, "groups_dropped_ids": []}]
    summary = {"steps": rows, "async_books": {"planner_next": 7, "left_ids": ["ag6-c"]}}
    audit = audit_groups(summary, "fully_async")
    assert not audit["ok"] and audit["lost"] == [3] and "1 of 7 groups" in audit["problems"][0]
    rows[1]["group_lags"]["ag3-x"] = 0
    assert audit_groups(summary, "fully_async")["ok"]
    rows.append({"step": 2, "group_lags": {"ag0-a": 0}, "groups_dropped_ids": []})
    bad = audit_groups(summary, "fully_async")
    assert bad["trained_twice"] == ["ag0-a"] and any("step 2 recorded 2 times" in p for p in bad["problems"])
    sync = [{"step": 1, "group_ids": ["st1-g0-a"]}, {"step": 3, "group_ids": ["st2-g0-b"]}]
    problems = audit_groups({"steps": sync}, "sync")["problems"]
    assert any("steps missing: [2]" in p for p in problems) and any("did not plan" in p for p in problems)


def test_end_books_name_the_leftovers():
    buf = GroupBuffer(groups_per_step=2, group_size=2, max_staleness=0, num_workers=4)
    p = GroupPlanner(["a"], 2, seed=0, replay=["ag7-a"])
    a, b = (p.next_group()[0].group_id for _ in range(2))
    buf.try_start(), buf.try_start()
    buf.on_done(_group(a), 1)
    buf.on_done(None, 1, cancelled=True, group_id=b)
    p.replay.append("ag8-a")
    books = end_books(buf, p)
    assert books["left_ids"] == [a, b, "ag8-a"] and books["balanced"] and books["planner_next"] == 1


def test_resumed_manager_derives_its_counters_from_the_rule():
    m = StalenessManager.resumed(max_staleness=1, batch_size=2, max_concurrency=8, version=5)
    assert (m.current_step, m.accepted, m.running) == (6, 10, 0) and m.headroom() == (1 + 1) * 2
    assert m.budget_excess() <= 0
    m.check_budget()
    buf = GroupBuffer(groups_per_step=2, group_size=2, max_staleness=1, num_workers=8, first_step=6)
    assert buf.try_start() == 6 and buf.manager.headroom() == 3  # tags are the run's own steps


def test_inflated_budget_is_named_after_the_sync():
    """AReaL #1345: the version restored, accepted not: the rule grants version x B extra groups."""
    m = StalenessManager(max_staleness=1, batch_size=2, max_concurrency=8, current_step=6)
    assert m.headroom() == 14  # the rule at step 1 gives 4
    with pytest.raises(CapacityError, match=r"inflated by 10 groups.*StalenessManager.resumed"):
        m.check_budget()
    fresh = StalenessManager(max_staleness=1, batch_size=2, max_concurrency=8)
    for _ in range(3):  # a consistent run: two accepted per step, never inflated
        for _ in range(2):
            fresh.try_start()
            fresh.on_accepted(fresh.current_step)
        fresh.advance()
        fresh.check_budget()
