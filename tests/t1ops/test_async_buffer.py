"""The fully async bookkeeping: capacity never exceeded, every group settled once, counts right."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.errors import ConfigError
from rl.staleness import CapacityError, StalenessManager
from rl.tito import Trajectory
from t1ops.campaign.async_buffer import GroupBuffer, spans_versions, version_lag_histogram
from t1ops.campaign.credit import is_flat
from tests.t1ops.results import group, trial


def make(**kw) -> GroupBuffer:
    base = dict(groups_per_step=2, group_size=2, max_staleness=1, num_workers=8)
    base.update(kw)
    return GroupBuffer(**base)


def test_zero_variance_groups_are_dropped_and_the_trainer_draws_on():
    buf = make()
    tags = [buf.try_start() for _ in range(4)]
    assert tags == [1, 1, 1, 1] and buf.try_start() is None  # (1 + 1) x 2 groups
    assert buf.on_done(group("a", [1.0, 1.0]), 1) == "zero_variance"
    assert buf.try_start() == 1  # the dropped group's slot came back: draw on
    assert buf.on_done(group("b", [0.0, 1.0]), 1) == "accepted"
    assert not buf.batch_ready()
    assert buf.on_done(group("c", [0.2]), 1) == "failed"  # a trial missing: partial group
    assert buf.on_done(group("d", [0.0, 0.5]), 1) == "accepted"
    batch = buf.take_batch()
    assert [g.group_id for g in batch] == ["b", "d"]
    row = buf.close_step()
    assert row["groups_trained"] == 2 and row["groups_dropped_zero_variance"] == 1 and row["groups_failed"] == 1
    assert row["groups_in_flight"] == 1 and buf.books()["balanced"]


def test_sample_full_batch_off_trains_on_fewer_groups():
    buf = make(sample_full_batch=False)
    for _ in range(2):
        buf.try_start()
    buf.on_done(group("a", [1.0, 1.0]), 1)
    buf.on_done(group("b", [0.0, 1.0]), 1)
    assert [g.group_id for g in buf.take_batch()] == ["b"]
    row = buf.close_step()
    assert row["groups_trained"] == 1 and row["groups_dropped_zero_variance"] == 1


def test_late_group_is_accepted_with_its_lag():
    buf = make(max_staleness=0, groups_per_step=1)
    assert buf.try_start() == 1
    for _ in range(3):
        buf.advance()
    assert buf.on_done(group("late", [0.0, 1.0]), 1) == "accepted"
    row = buf.close_step()
    assert row["staleness_violations"] == 1 and row["violation_lags"] == [3]


def test_endless_zero_variance_stops_with_the_fix_named():
    buf = make(max_draws_factor=1)
    with pytest.raises(ConfigError, match="zero_variance_filter = false"):
        for i in range(10):
            buf.try_start()
            buf.on_done(group(f"g{i}", [0.0, 0.0]), 1)


def test_capacity_is_checked_in_production():
    mgr = StalenessManager(max_staleness=0, batch_size=1, max_concurrency=4)
    mgr.try_start()
    mgr.accepted = 5  # an accounting bug
    with pytest.raises(CapacityError, match="capacity exceeded"):
        mgr.check_bounds()
    with pytest.raises(CapacityError):
        mgr.on_accepted(1)


@settings(max_examples=80, deadline=None)
@given(S=st.integers(0, 3), B=st.integers(1, 4), W=st.integers(1, 12), full=st.booleans(),
       ops=st.lists(st.tuples(st.sampled_from(["start", "finish", "train"]), st.integers(0, 50),
                              st.sampled_from(["useful", "zero", "failed", "cancelled"])), max_size=120))
def test_bounds_and_books_hold_under_any_schedule(S, B, W, full, ops):
    buf = GroupBuffer(groups_per_step=B, group_size=2, max_staleness=S, num_workers=W, sample_full_batch=full,
                      max_draws_factor=1000)
    running: list[tuple[int, str]] = []
    settled: set[str] = set()
    n = 0
    for op, pick, kind in ops:
        if op == "start":
            tag = buf.try_start()
            if tag is not None:
                running.append((tag, f"g{n}"))
                n += 1
        elif op == "finish" and running:
            tag, gid = running.pop(pick % len(running))  # groups finish in any order
            rewards = {"useful": [0.0, 1.0], "zero": [1.0, 1.0], "failed": [1.0], "cancelled": [0.0, 1.0]}[kind]
            buf.on_done(group(gid, rewards), tag, cancelled=kind == "cancelled")
            assert gid not in settled
            settled.add(gid)
        elif op == "train" and buf.batch_ready():
            buf.take_batch()
            buf.close_step()
            buf.advance()
        m = buf.manager
        assert m.running == len(running) <= W
        assert m.accepted + m.running <= (S + m.current_step) * B
        assert buf.queue.qsize() <= buf.queue_size
        books = buf.books()
        assert books["balanced"] and books["submitted"] == n


def test_lag_histogram_and_spanning_trajectories():
    def chunk(versions, mask):
        n = len(versions)
        return Trajectory(tokens=np.arange(n), loss_mask=np.asarray(mask, dtype=np.int8),
                          rollout_logprobs=np.zeros(n, dtype=np.float32), engine_tokens=np.arange(n),
                          origin=np.zeros(n, dtype=np.int8), policy_version=np.asarray(versions, dtype=np.int32),
                          routing=None, meta={})
    spanning = trial("g-s0", chunks=[chunk([-1, 1, 1, -1, 2, 3], [0, 1, 1, 0, 1, 1])])
    single = trial("g-s1", chunks=[chunk([-1, 3, 3], [0, 1, 1])])
    assert spans_versions(spanning) == [1, 2, 3] and spans_versions(single) == [3]
    assert version_lag_histogram([spanning, single], trainer_version=3) == {0: 3, 1: 1, 2: 2}
    assert is_flat([0.4, 0.4]) and not is_flat([0.4, 0.5])


def test_config_modes_and_refusals():
    from t1ops.config import parse_config

    assert parse_config({}).pipeline_mode == "one_step"
    assert parse_config({"run": {"mode": "sync"}}).pipeline_mode == "sync"
    with pytest.raises(ConfigError, match=r"renamed: use 'run.mode"):  # one key for one thing
        parse_config({"run": {"one_step_pipeline": False}})
    cfg = parse_config({"run": {"mode": "fully_async"}, "fully_async": {"max_staleness_steps": 3}})
    assert cfg.pipeline_mode == "fully_async" and cfg.fully_async.max_staleness_steps == 3
    # the multi-rank trainer takes the rollout behaviour too (rl.trainer.step.behaviour_plan): no refusal
    assert parse_config({"run": {"mode": "fully_async"}, "trainer": {"parallel": {"dp": 2}}}).trainer.parallel.dp == 2
    with pytest.raises(ConfigError, match="run.mode"):
        parse_config({"run": {"mode": "async"}})
