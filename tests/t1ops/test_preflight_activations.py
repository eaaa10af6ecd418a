"""The memory model's per-token activation term against CPU ranks, layout by layout.

The default run compares the model's scaling with the layout (its activation bytes per rank at one rank
over those at the layout, ``t1ops.preflight.cpu_activations.model_bytes_per_token``) against the same
ratio of the measured points recorded in ``calibration.ACTIVATION_LAYOUT_POINTS``: no ranks, no training.
The heavy test (``pytest --heavy``) measures the points again on gloo ranks and checks the record.
Print the table with ``-s``; docs/preflight.md explains it.
"""
from __future__ import annotations

import pytest

from t1ops.campaign.trainer_rank import measure_layouts
from t1ops.preflight import calibration as cal
from t1ops.preflight.cpu_activations import (
    LAYOUTS,
    model_bytes_per_token,
    recorded_points,
)

#: Largest relative difference allowed between the model's and the measured ratio to one rank.
RATIO_TOLERANCE = 0.15
#: Layouts whose scaling the model claims for this run's regime. tp = 2 + SP is not among them: the model keeps
#: a layer's activations whole over TP (full recompute keeps the all-gathered input, report 08), the CPU
#: ranks run without recompute and halve them (1.99x, recorded; docs/preflight.md "Limits").
MODELLED = ("1 rank", "cp2", "pp2")


def ratios():
    points = {p.name: p for p in recorded_points()}
    one = points["1 rank"]
    return {name: (one.measured / p.measured, one.model / p.model) for name, p in points.items()}


def test_model_layout_scaling_matches_cpu_ranks():
    rows = ratios()
    print("\nlayout       measured 1-rank/layout  model 1-rank/layout")
    for name, (measured, model) in rows.items():
        print(f"{name:12s} {measured:22.2f}x {model:19.2f}x")
    for name in MODELLED:
        measured, model = rows[name]
        assert model == pytest.approx(measured, rel=RATIO_TOLERANCE), name


@pytest.mark.parametrize("ignored", ["cp", "pp"])
def test_a_model_that_ignored_a_layout_dimension_fails_the_comparison(ignored):
    """The comparison has teeth: the model with cp (or pp) left out of its activation term is off by more
    than the tolerance on the layouts that use it."""
    rows = ratios()
    one = model_bytes_per_token(1, 1, 1)
    for name in MODELLED:
        tp, pp, cp = LAYOUTS[name]
        if (ignored == "cp" and cp > 1) or (ignored == "pp" and pp > 1):
            blind = one / model_bytes_per_token(tp, 1 if ignored == "pp" else pp, 1 if ignored == "cp" else cp)
            assert blind != pytest.approx(rows[name][0], rel=RATIO_TOLERANCE), name


@pytest.mark.heavy
def test_cpu_ranks_reproduce_the_recorded_points():
    """The record is what the ranks measure now (saved bytes are a function of the shapes: no noise)."""
    measured = {name: max(per_rank) / cal.ACTIVATION_LONG_TOKENS for name, per_rank in measure_layouts().items()}
    for name, value in measured.items():
        print(f"{name}: {value:.1f} B/token/rank (recorded {cal.ACTIVATION_LAYOUT_POINTS[name]:.1f})")
    for name, value in measured.items():
        assert value == pytest.approx(cal.ACTIVATION_LAYOUT_POINTS[name], rel=0.02), name
