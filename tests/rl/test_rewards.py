"""rl.rewards: CTRF reward, fallbacks on hostile reports, length shaping."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl.errors import InputError, RewardError
from rl.length_shaping import LengthShaping, shape_length
from rl.rewards import FALLBACK_SOURCES, RewardResult, ctrf_reward

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def report(statuses: list[str]) -> dict:
    counts = {s: statuses.count(s) for s in ("passed", "failed", "skipped", "pending", "other")}
    return {"reportFormat": "CTRF", "results": {
        "tool": {"name": "pytest"},
        "summary": {"tests": len(statuses), **counts, "start": 0, "stop": 1},
        "tests": [{"name": f"t{i}", "status": s, "duration": 1} for i, s in enumerate(statuses)]}}


# --- the reward --------------------------------------------------------------
def test_absolute_count_over_fixed_scale():
    assert ctrf_reward(report(["passed"] * 40)) == RewardResult(2.0, "ctrf", 40, 40)
    r = ctrf_reward(report(["passed"] * 3 + ["failed", "skipped"]), solved=False)
    assert (r.value, r.source, r.passed, r.total) == (0.15, "ctrf", 3, 5)
    assert ctrf_reward(report(["passed"] * 3), scale=10).value == pytest.approx(0.3)
    # 55 passes: 2.75, the report's observed maximum on RST-38k (no cap)
    assert ctrf_reward(report(["passed"] * 55)).value == pytest.approx(2.75)


def test_real_pytest_ctrf_file(tmp_path):
    (tmp_path / "test_task.py").write_text(
        "import pytest\n"
        "def test_a(): pass\n"
        "def test_b(): pass\n"
        "def test_c(): assert 0\n"
        "@pytest.mark.skip\n"
        "def test_d(): pass\n")
    out = tmp_path / "verifier" / "ctrf.json"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--ctrf", str(out),
                    str(tmp_path / "test_task.py")], cwd=tmp_path, capture_output=True, timeout=120)
    r = ctrf_reward(out, solved=False)
    assert (r.value, r.source, r.passed, r.total) == (pytest.approx(2 / 20), "ctrf", 2, 4)


# --- fallbacks ---------------------------------------------------------------
def test_missing_report_falls_back_to_binary(tmp_path):
    r = ctrf_reward(tmp_path / "verifier" / "ctrf.json", solved=True)
    assert (r.value, r.source, r.passed) == (1.0, "fallback:missing", None)
    assert ctrf_reward(None, solved=False).value == 0.0
    unknown = ctrf_reward(None)
    assert unknown.value == 0.0 and "no terminal outcome" in unknown.detail


def test_truncated_json_is_unparsable_not_a_crash(tmp_path):
    path = tmp_path / "ctrf.json"
    path.write_text(json.dumps(report(["passed"] * 5))[:57])
    r = ctrf_reward(path, solved=True)
    assert (r.value, r.source) == (1.0, "fallback:unparsable")


def test_unreadable_and_binary_garbage(tmp_path):
    assert ctrf_reward(tmp_path, solved=True).source == "fallback:unreadable"  # a directory
    bad = tmp_path / "ctrf.json"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    assert ctrf_reward(bad, solved=True).source == "fallback:unreadable"


@pytest.mark.parametrize("mutate", [
    lambda r: r["results"]["summary"].__setitem__("passed", "3"),    # string count
    lambda r: r["results"]["summary"].__setitem__("passed", 3.0),    # float count
    lambda r: r["results"]["summary"].__setitem__("tests", True),    # bool count
    lambda r: r["results"]["summary"].__setitem__("failed", -1),
    lambda r: r["results"].__setitem__("tests", {"a": 1}),            # tests not a list
    lambda r: r["results"]["tests"].append("passed"),                 # entry not an object
    lambda r: r["results"]["tests"][0].__setitem__("status", "ok"),  # unknown status
    lambda r: r.pop("results"),
])
def test_wrong_types_are_malformed(mutate):
    bad = copy.deepcopy(report(["passed"] * 3 + ["failed"]))
    mutate(bad)
    r = ctrf_reward(bad, solved=True)
    assert (r.value, r.source, r.passed) == (1.0, "fallback:malformed", None), r.detail


def test_top_level_wrong_type():
    assert ctrf_reward([1, 2, 3], solved=True).source == "fallback:malformed"
    assert ctrf_reward(42, solved=False).source == "fallback:malformed"


def test_summary_disagreeing_with_test_list_is_inconsistent():
    bad = report(["passed", "failed"])
    bad["results"]["summary"]["passed"] = 40  # summary claims 40 passes, the list shows 1
    bad["results"]["summary"]["tests"] = 40
    r = ctrf_reward(bad, solved=False)
    assert (r.value, r.source) == (0.0, "fallback:inconsistent") and "40/40" in r.detail


def test_empty_report_and_solved_with_zero_passes():
    assert ctrf_reward(report([]), solved=True) == RewardResult(1.0, "fallback:empty", None, None,
                                                                "CTRF lists zero tests", "fallback:empty")
    r = ctrf_reward(report(["failed", "failed"]), solved=True)
    assert (r.value, r.source) == (1.0, "fallback:inconsistent")
    assert ctrf_reward(report(["failed", "failed"]), solved=False) == RewardResult(0.0, "ctrf", 0, 2)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 50) | st.floats(allow_nan=False)
                           | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                      max_size=4), max_leaves=20)


@FAST
@given(st.one_of(json_values, st.builds(lambda s: {"results": s}, json_values),
                 st.builds(lambda s, t: {"results": {"summary": s, "tests": t}}, json_values, json_values)),
       st.sampled_from([True, False, None]))
def test_any_json_never_crashes_and_solved_never_zero(doc, solved):
    r = ctrf_reward(doc, solved=solved)
    assert r.source == "ctrf" or r.source in FALLBACK_SOURCES
    if solved:
        assert r.value > 0
    if r.source != "ctrf":
        assert r.passed is None and r.detail


@FAST
@given(st.binary(max_size=200), st.integers(0, 400))
def test_any_bytes_or_prefix_never_crashes(tmp_path_factory, blob, cut):
    path = tmp_path_factory.mktemp("c") / "ctrf.json"
    path.write_bytes(blob)
    assert ctrf_reward(path, solved=True).value > 0
    full = json.dumps(report(["passed"] * 4 + ["failed"]))
    path.write_text(full[:cut])
    r = ctrf_reward(path, solved=True)
    assert r.source == ("ctrf" if cut >= len(full) else "fallback:unparsable")


def test_bad_scale_and_solved_raise_reward_error():
    for scale in (0, -20.0, float("nan"), float("inf"), "20"):
        with pytest.raises(RewardError, match="scale"):
            ctrf_reward(report(["passed"]), scale=scale)
    with pytest.raises(RewardError, match="solved"):
        ctrf_reward(report(["passed"]), solved=1)


# --- length shaping ----------------------------------------------------------
S = 20.0


def test_multiplicative_report_ordering_and_free_zone():
    five_at_50 = float(shape_length(5 / S, 50, "multiplicative"))
    four_at_22 = float(shape_length(4 / S, 22, "multiplicative"))
    assert five_at_50 == pytest.approx(0.125) and four_at_22 == pytest.approx(0.2)
    assert five_at_50 < four_at_22
    assert float(shape_length(3 / S, 25, "multiplicative")) == pytest.approx(0.15)  # free zone edge


def test_multiplicative_zero_passes_small_negative_below_any_pass():
    zero = shape_length(torch.zeros(3), torch.tensor([10.0, 25.0, 400.0]), "multiplicative")
    assert zero.tolist() == pytest.approx([-0.025, -0.025, -0.025 * (2 - 25 / 400)])
    one_pass_long = float(shape_length(1 / S, 500, "multiplicative"))
    assert one_pass_long > 0 > float(zero.max())


@FAST
@given(st.integers(0, 60), st.floats(0, 500), st.floats(0, 500))
def test_multiplicative_never_rewards_more_turns(passed, t1, t2):
    lo, hi = sorted((t1, t2))
    assert float(shape_length(passed / S, lo, "multiplicative")) >= float(shape_length(passed / S, hi, "multiplicative"))


def test_additive_penalty_is_sub_dominant_which_is_why_it_failed():
    five_at_50 = float(shape_length(5 / S, 50, "additive_penalty"))
    four_at_22 = float(shape_length(4 / S, 22, "additive_penalty"))
    assert five_at_50 == pytest.approx(0.25 - 0.04) and four_at_22 == pytest.approx(0.2 - 0.0176)
    assert five_at_50 > four_at_22  # farming a test by rambling pays: turns rose 22 -> 50+
    assert LengthShaping().max_penalty < 1 / S


def test_efficiency_bonus_only_reaches_shortest_full_solves():
    reward = torch.tensor([0.2, 0.2, 0.2, 0.1, 0.2])
    turns = torch.tensor([10.0, 20.0, 30.0, 5.0, 8.0])
    solved = torch.tensor([1, 1, 1, 0, 1])
    bucket = torch.tensor([4, 4, 4, 4, 7])  # same-test-count buckets; the 7-bucket solve is alone
    out = shape_length(reward, turns, "efficiency_bonus", solved=solved, bucket=bucket)
    assert out.tolist() == pytest.approx([0.225, 0.2125, 0.2, 0.1, 0.2])


def test_shaping_bad_input():
    with pytest.raises(InputError, match="mode"):
        shape_length(0.1, 3, "log")
    with pytest.raises(InputError, match="turns"):
        shape_length(0.1, -1, "multiplicative")
    with pytest.raises(RewardError, match="reward"):
        shape_length(float("nan"), 3, "multiplicative")
    with pytest.raises(RewardError, match=">= 0"):
        shape_length(-0.1, 3, "multiplicative")
    with pytest.raises(InputError, match="solved"):
        shape_length(torch.tensor([0.1]), torch.tensor([3.0]), "efficiency_bonus")
    with pytest.raises(InputError, match="shape mismatch"):
        shape_length(torch.tensor([0.1, 0.2]), torch.tensor([3.0]), "additive_penalty")
