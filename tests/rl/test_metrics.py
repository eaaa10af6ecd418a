"""rl.metrics: token reducer, log-prob gap, explained variance, reducer verification."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.errors import InputError, MetricError
from rl.metrics import (TokenMean, direct_token_mean, explained_variance, logprob_gap, token_mean_over,
                        verify_reducer)

FAST = settings(max_examples=40, deadline=None)


def group_sum_reducer(values, masks):
    """The report's bug shape: token sums over a per-sample (group) denominator."""
    per_mb = [float((v * m).sum()) / v.shape[0] for v, m in zip(values, masks)]
    return sum(per_mb) / len(per_mb)


# --- log-prob gap ------------------------------------------------------------
def test_logprob_gap_hand_computed():
    train = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -0.2, 0.0]])
    rollout = torch.tensor([[-1.1, -2.0, -9.0], [-0.1, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    # valid gaps: 0.1, 0, 0, 0.3 -> 0.4 / 4
    assert logprob_gap(train, rollout, mask) == pytest.approx(0.1)


def test_logprob_gap_over_ragged_micro_batches_equals_whole_batch():
    mbs_train = [torch.tensor([[-1.0, -2.0, -0.5]]), torch.tensor([[-0.1, -0.2]])]
    mbs_roll = [torch.tensor([[-1.1, -2.0, -9.0]]), torch.tensor([[-0.1, -0.5]])]
    mbs_mask = [torch.tensor([[1, 1, 0]]), torch.tensor([[1, 1]])]
    assert logprob_gap(mbs_train, mbs_roll, mbs_mask) == pytest.approx(0.1)


@st.composite
def batch(draw):
    B = draw(st.integers(1, 6))
    T = draw(st.integers(1, 10))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)))
    mask[0, 0] = True
    train = torch.tensor(draw(st.lists(st.floats(-20, 0), min_size=B * T, max_size=B * T))).reshape(B, T)
    roll = torch.tensor(draw(st.lists(st.floats(-20, 0), min_size=B * T, max_size=B * T))).reshape(B, T)
    mbs = draw(st.integers(1, B))
    return train, roll, mask, mbs


@FAST
@given(batch())
def test_logprob_gap_matches_direct_computation_at_any_micro_batch_size(b):
    train, roll, mask, mbs = b
    direct = float((train - roll).abs()[mask].double().mean())
    split = lambda x: list(torch.split(x, mbs))  # noqa: E731
    assert logprob_gap(train, roll, mask) == pytest.approx(direct, rel=1e-5, abs=1e-9)
    assert logprob_gap(split(train), split(roll), split(mask)) == pytest.approx(direct, rel=1e-5, abs=1e-9)
    one = lambda x: list(torch.split(x, 1))  # noqa: E731  micro-batch size 1, the report's setting
    assert logprob_gap(one(train), one(roll), one(mask)) == pytest.approx(direct, rel=1e-5, abs=1e-9)


def test_logprob_gap_ignores_nan_on_masked_positions():
    train = torch.tensor([[-1.0, float("nan")]])
    assert logprob_gap(train, torch.tensor([[-1.5, float("nan")]]), torch.tensor([[1, 0]])) == pytest.approx(0.5)


# --- reducers ----------------------------------------------------------------
def test_token_mean_streaming_and_merge():
    a = TokenMean().add(torch.tensor([1.0, 2.0, 100.0]), torch.tensor([1, 1, 0]))
    b = TokenMean().add(torch.tensor([[6.0]]), torch.tensor([[1]]))
    assert a.value() == pytest.approx(1.5) and a.merge(b).value() == pytest.approx(3.0)
    with pytest.raises(InputError, match="zero valid tokens"):
        TokenMean().value()


def test_verify_reducer_catches_group_sum_denominator_at_micro_batch_size_one():
    torch.manual_seed(0)
    gaps = torch.rand(4, 1000) * 0.04  # ~0.02 per token, 1000 tokens per sample
    masks = torch.ones(4, 1000, dtype=torch.bool)
    values, mask_mbs = list(torch.split(gaps, 1)), list(torch.split(masks, 1))
    assert verify_reducer(token_mean_over, values, mask_mbs) == pytest.approx(float(gaps.mean()), rel=1e-6)
    with pytest.raises(MetricError) as err:
        verify_reducer(group_sum_reducer, values, mask_mbs, name="group_sum")
    assert err.value.context["ratio"] == pytest.approx(1000, rel=1e-6)
    assert "group_sum reports" in str(err.value) and "token_mean_over" in str(err.value)


def test_direct_token_mean_bad_input():
    with pytest.raises(InputError, match="no valid tokens"):
        direct_token_mean([torch.zeros(1, 2)], [torch.zeros(1, 2)])
    with pytest.raises(InputError, match="empty list"):
        token_mean_over([], [])
    with pytest.raises(InputError, match="2 value micro-batches but 1 mask"):
        token_mean_over([torch.zeros(1), torch.zeros(1)], [torch.ones(1)])


# --- explained variance ------------------------------------------------------
def test_explained_variance_hand_computed():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.5), returns, mask) == pytest.approx(0.0)
    # residuals (1, -1, 1, -1): Var 1 vs Var(returns) 1.25 -> 1 - 0.8
    assert explained_variance(returns - torch.tensor([[1.0, -1.0, 1.0, -1.0]]), returns, mask) == pytest.approx(0.2)
    # a fresh value head with residuals of ~34x the return variance: EV ~ -33 (report: -33.6 at cold start)
    assert explained_variance(returns + torch.tensor([[6.5, -6.5, 6.5, -6.5]]), returns, mask) < -30


def test_explained_variance_masked_positions_ignored_and_constant_returns_nan():
    values = torch.tensor([[1.0, 2.0, float("nan")]])
    returns = torch.tensor([[1.0, 2.0, 99.0]])
    assert explained_variance(values, returns, torch.tensor([[1, 1, 0]])) == pytest.approx(1.0)
    assert math.isnan(explained_variance(torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3)))


@FAST
@given(batch())
def test_explained_variance_never_above_one(b):
    values, returns, mask, _ = b
    ev = explained_variance(values, returns, mask)
    assert math.isnan(ev) or ev <= 1.0 + 1e-9


def test_metrics_bad_input():
    with pytest.raises(InputError, match=r"train_logprobs\[1, 2\]"):
        logprob_gap(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 3))
    with pytest.raises(InputError, match="micro-batch counts differ"):
        logprob_gap([torch.zeros(1, 2)], [torch.zeros(1, 2)] * 2, [torch.ones(1, 2)])
    with pytest.raises(InputError, match="rollout_logprobs"):
        logprob_gap(torch.zeros(1, 1), torch.tensor([[float("nan")]]), torch.ones(1, 1))
    with pytest.raises(InputError, match="no valid position"):
        explained_variance(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2))
    with pytest.raises(InputError, match="values"):
        explained_variance(torch.zeros(2), torch.zeros(3), torch.ones(3))


def test_explained_variance_is_nan_for_fp32_constant_returns():
    import math

    import torch

    from rl.metrics import explained_variance

    returns = torch.full((2, 5), 0.4, dtype=torch.float32) + torch.tensor([0.0, 3e-8]).view(2, 1)
    values = torch.randn(2, 5)
    assert math.isnan(explained_variance(values, returns, torch.ones(2, 5, dtype=torch.bool)))


def test_checked_logprob_gap_runs_the_reducer_self_check(monkeypatch):
    """The trainer's gap goes through a named reducer that verify_reducer checks on the step's own data."""
    import pytest

    from rl import metrics
    from rl.errors import InputError, MetricError

    g = torch.Generator().manual_seed(0)
    train, rollout = torch.randn(3, 40, generator=g), torch.randn(3, 40, generator=g)
    mask = torch.rand(3, 40, generator=g) > 0.3
    assert metrics.checked_logprob_gap(train, rollout, mask) == pytest.approx(
        metrics.logprob_gap(train, rollout, mask), rel=1e-9)
    monkeypatch.setitem(metrics.REDUCERS, "per_sample", lambda vs, ms: sum(float((v * m).sum()) for v, m in zip(vs, ms)) / len(vs))
    with pytest.raises(MetricError, match="per_sample reports"):
        metrics.checked_logprob_gap(train, rollout, mask, "per_sample")
    with pytest.raises(InputError, match="unknown gap reducer"):
        metrics.checked_logprob_gap(train, rollout, mask, "nope")
