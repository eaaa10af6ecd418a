"""The pool's rule for which weight versions a finished response may carry (abort vs in-place pause)."""
from __future__ import annotations

from rl.engines import protocol as P
from t1ops.engines.requests import response_versions_ok


def resp(*spans: tuple[str, int, int]) -> P.GenerateResponse:
    n = spans[-1][2]
    return P.GenerateResponse(output_ids=tuple(range(n)), finish_reason=P.FinishReason(type="length", length=n),
                              weight_version=spans[-1][0], prompt_tokens=1, completion_tokens=n,
                              weight_versions=tuple(P.WeightVersionSpan(v, a, b) for v, a, b in spans))


HISTORY = ["0", "1", "2", "3"]


def test_abort_mode_takes_one_version_admitted_or_current():
    assert response_versions_ok(resp(("1", 0, 4)), "1", HISTORY)
    assert response_versions_ok(resp(("3", 0, 4)), "1", HISTORY)          # held by the barrier, ran after it
    assert not response_versions_ok(resp(("2", 0, 4)), "1", HISTORY)      # neither admitted nor current
    assert not response_versions_ok(resp(("1", 0, 2), ("3", 2, 4)), "1", HISTORY)  # spans: never in abort mode


def test_in_place_takes_versions_published_since_admission_in_order():
    assert response_versions_ok(resp(("1", 0, 2), ("2", 2, 3), ("3", 3, 4)), "1", HISTORY, "in_place")
    assert response_versions_ok(resp(("3", 0, 4)), "1", HISTORY, "in_place")
    assert not response_versions_ok(resp(("0", 0, 2), ("1", 2, 4)), "1", HISTORY, "in_place")  # before admission
    assert not response_versions_ok(resp(("2", 0, 2), ("1", 2, 4)), "1", HISTORY, "in_place")  # out of order
    assert not response_versions_ok(resp(("1", 0, 2), ("9", 2, 4)), "1", HISTORY, "in_place")  # never published
    assert not response_versions_ok(resp(("1", 0, 4)), "7", HISTORY, "in_place")               # unknown admission


def test_direct_callers_apply_the_pools_rule_from_its_view():
    from t1ops.engines.direct import _versions_ok_in

    spanning = resp(("1", 0, 2), ("2", 2, 4))
    in_place = {"version": "2", "history": ["0", "1", "2"], "pause_mode": "in_place"}
    assert _versions_ok_in(in_place, "1", spanning)
    assert not _versions_ok_in({**in_place, "pause_mode": "abort"}, "1", spanning)
    assert not _versions_ok_in({"version": "2"}, "1", spanning)  # an older view: abort rules
    assert _versions_ok_in({"version": "2"}, "1", resp(("1", 0, 4)))
