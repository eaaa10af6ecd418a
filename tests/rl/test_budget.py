"""The context budget guard: prompt + max_new_tokens never exceeds the window."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from rl.agent.budget import compaction_threshold, fit_generation
from rl.errors import BudgetError


def test_report_numbers_are_refused_or_clamped():
    # 78,541 + 8,192 = 86,733 > 86,016 (the report's off-by-717)
    b = fit_generation(78_541, 8_192, 86_016)
    assert b.clamped and b.max_new_tokens == 86_016 - 78_541 and b.total == 86_016
    with pytest.raises(BudgetError, match="compact the history by at least 717"):
        fit_generation(78_541, 8_192, 86_016, min_new_tokens=8_192)


def test_threshold_derived_from_request():
    assert compaction_threshold(86_016, 8_192) == 77_824  # not 86,016 - 4,000
    with pytest.raises(BudgetError):
        compaction_threshold(100, 100)


@given(st.integers(0, 200_000), st.integers(0, 50_000), st.integers(1, 200_000), st.integers(1, 1000))
def test_never_exceeds_window(prompt, new, ctx, min_new):
    try:
        b = fit_generation(prompt, new, ctx, min_new)
    except BudgetError:
        assert ctx - prompt < min_new
        return
    assert b.total <= ctx and b.max_new_tokens <= new
    assert b.clamped == (prompt + new > ctx)


def test_a_request_is_built_only_for_the_prompt_its_budget_was_fitted_for():
    fit = fit_generation(10, 8, 16)
    req = fit.request(list(range(10)), "s-t0", temperature=0.7, routed_upto=3, routing=True)
    assert (req.sampling_params.max_new_tokens, req.routed_experts_start_len, req.rid) == (6, 3, "s-t0")
    assert len(req.input_ids) + req.sampling_params.max_new_tokens <= 16
    with pytest.raises(BudgetError, match="fitted for 10 prompt tokens, not 11"):
        fit.request(list(range(11)), "s-t1", temperature=1.0, routed_upto=0, routing=False)
