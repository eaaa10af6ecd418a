"""rl.staleness: the walkthrough's capacity rule, violations recorded, accounting errors."""
from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.errors import InputError
from rl.staleness import StalenessManager, StalenessViolation


def fill(mgr: StalenessManager) -> list[int]:
    tags = []
    while (tag := mgr.try_start()) is not None:
        tags.append(tag)
    return tags


def test_walkthrough_397b_numbers():
    # batch 16 groups, staleness 3, 64 generation workers: headroom B(S+1) = 64 groups
    mgr = StalenessManager(max_staleness=3, batch_size=16, max_concurrency=64)
    assert mgr.capacity() == 64
    assert fill(mgr) == [1] * 64 and mgr.capacity() == 0
    for _ in range(16):
        assert mgr.on_accepted(1) is None
    # 16 workers are free but the consumer bound (3 + 1) * 16 = 64 = accepted + running holds them
    assert (mgr.running, mgr.accepted, mgr.capacity()) == (48, 16, 0)
    mgr.advance()
    assert mgr.capacity() == 16  # (3 + 2) * 16 - 64


def test_concurrency_bound_binds_before_consumer_bound():
    mgr = StalenessManager(max_staleness=3, batch_size=16, max_concurrency=10)
    assert len(fill(mgr)) == 10
    mgr.on_released()
    assert mgr.capacity() == 1 and mgr.stats()["released"] == 1


def test_late_group_is_accepted_and_violation_recorded():
    mgr = StalenessManager(max_staleness=1, batch_size=2, max_concurrency=8)
    tag = mgr.try_start()
    for _ in range(3):
        mgr.advance()
    v = mgr.on_accepted(tag)
    assert v == StalenessViolation(started_step=1, accepted_step=4, staleness=3, max_staleness=1)
    assert mgr.violations == [v] and mgr.accepted == 1 and mgr.stats()["num_violations"] == 1
    on_time = mgr.try_start()
    mgr.advance()
    assert mgr.on_accepted(on_time) is None  # staleness 1 == max_staleness: fine


def test_zero_staleness_is_synchronous():
    mgr = StalenessManager(max_staleness=0, batch_size=4, max_concurrency=100)
    assert len(fill(mgr)) == 4  # exactly one batch per step


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 4), st.integers(1, 8), st.integers(1, 40),
       st.lists(st.sampled_from(["start", "accept", "release", "advance"]), max_size=80))
def test_bounds_hold_under_any_schedule(S, B, C, ops):
    mgr = StalenessManager(S, B, C)
    started: list[int] = []
    for op in ops:
        if op == "start":
            tag = mgr.try_start()
            if tag is not None:
                started.append(tag)
        elif op in ("accept", "release") and started:
            tag = started.pop(0)
            mgr.on_accepted(tag) if op == "accept" else mgr.on_released()
        elif op == "advance":
            mgr.advance()
        assert 0 <= mgr.running <= C and mgr.running == len(started)
        assert mgr.capacity() >= 0
        # accepting moves a group from running to accepted, releasing and advancing only loosen it
        assert mgr.accepted + mgr.running <= (S + mgr.current_step) * B
    assert all(v.staleness > S for v in mgr.violations)


def test_threads_never_oversubscribe():
    mgr = StalenessManager(max_staleness=2, batch_size=5, max_concurrency=1000)
    granted: list[int] = []

    def worker():
        for _ in range(50):
            if mgr.try_start() is not None:
                granted.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == mgr.running == 15


def test_bad_construction_and_accounting():
    with pytest.raises(InputError, match="batch_size"):
        StalenessManager(3, 0, 64)
    with pytest.raises(InputError, match="max_staleness"):
        StalenessManager(-1, 16, 64)
    with pytest.raises(InputError, match="max_concurrency"):
        StalenessManager(3, 16, 2.5)
    mgr = StalenessManager(3, 16, 64)
    with pytest.raises(InputError, match="no group running"):
        mgr.on_released()
    with pytest.raises(InputError, match="no group running"):
        mgr.on_accepted(1)
    mgr.try_start()
    with pytest.raises(InputError, match="ahead of current_step"):
        mgr.on_accepted(5)
