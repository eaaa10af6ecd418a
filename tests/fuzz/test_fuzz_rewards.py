"""Fuzz the CTRF reward (rl/rewards.py): the report comes from inside the agent's sandbox.

Contract under test: any CTRF input (a dict, a path, random bytes on disk,
truncated JSON, wrong types, a summary that disagrees with its test list)
yields a RewardResult; an unusable report is a *tagged* fallback, never a
crash and never a silent zero for a solved trial. Only the caller's own
arguments (``scale``, ``solved``) raise RewardError. Valid reports round-trip.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from fuzz_common import FAST, SLOW_IO, json_values, mutate, mutations, only_t1ops_errors
from rl.errors import RewardError
from rl.rewards import CTRF_STATUSES, FALLBACK_SOURCES, SOURCE_CTRF, ctrf_reward

solved_values = st.none() | st.booleans()


def _report(statuses: list[str]) -> dict:
    summary = {s: statuses.count(s) for s in CTRF_STATUSES}
    summary["tests"] = len(statuses)
    return {"results": {"tool": {"name": "pytest"}, "summary": summary,
                        "tests": [{"name": f"test_{i}", "status": s} for i, s in enumerate(statuses)]}}


VALID = _report(["passed", "failed", "passed", "skipped"])


def _check(res, solved) -> None:
    """What every reward guarantees, whatever the report held."""
    assert res.source == SOURCE_CTRF or res.source in FALLBACK_SOURCES
    if solved:
        assert res.value > 0, f"a solved trial scored {res.value} ({res.source}: {res.detail})"
    if res.source == SOURCE_CTRF:
        assert isinstance(res.passed, int) and isinstance(res.total, int)
        assert 0 <= res.passed <= res.total and res.value == res.passed / 20.0
        assert not (solved and res.passed == 0)
    else:
        assert res.passed is None and res.total is None and res.detail
        assert res.value == (1.0 if solved else 0.0)


@FAST
@given(json_values, solved_values)
@example({"results": {"summary": {"tests": 1, "passed": 1}, "tests": [{"status": ["passed"]}]}}, True)
@example({"results": {"summary": {"tests": 1, "passed": True}, "tests": [{"status": "passed"}]}}, None)
def test_any_parsed_json_gives_a_tagged_reward(report, solved):
    _check(ctrf_reward(report, solved=solved), solved)


@FAST
@given(mutations(VALID), solved_values)
def test_one_mutated_field_falls_back_or_stays_consistent(edit, solved):
    path, value, delete = edit
    res = ctrf_reward(mutate(VALID, path, value, delete), solved=solved)
    _check(res, solved)
    if res.source == SOURCE_CTRF:  # accepted: the counts must still agree with the test list
        assert (res.passed, res.total) == (2, 4)


@FAST
@given(st.lists(st.sampled_from(CTRF_STATUSES), min_size=1, max_size=40), solved_values)
def test_consistent_reports_round_trip(statuses, solved):
    res = ctrf_reward(json.loads(json.dumps(_report(statuses))), solved=solved)
    passed = statuses.count("passed")
    if solved and passed == 0:
        assert res.source == "fallback:inconsistent" and res.value == 1.0
    else:
        assert (res.source, res.passed, res.total) == (SOURCE_CTRF, passed, len(statuses))


@FAST
@given(st.lists(st.sampled_from(CTRF_STATUSES), min_size=1, max_size=10),
       st.sampled_from(["tests", "passed", "failed"]), st.integers(1, 5), solved_values)
def test_summary_disagreeing_with_the_test_list_is_inconsistent(statuses, key, delta, solved):
    report = _report(statuses)
    report["results"]["summary"][key] += delta
    res = ctrf_reward(report, solved=solved)
    assert res.source == "fallback:inconsistent", res
    _check(res, solved)


# --- files written by the agent ------------------------------------------------------------
_VALID_TEXT = json.dumps(VALID)
_file_contents = (st.binary(max_size=200)
                  | json_values.map(lambda v: json.dumps(v).encode())
                  | st.integers(0, len(_VALID_TEXT) - 1).map(lambda n: _VALID_TEXT[:n].encode())
                  | st.just(b"[" * 100_000)                                  # nesting bomb
                  | st.just(_VALID_TEXT.encode("utf-16")))


@SLOW_IO
@given(_file_contents, solved_values)
def test_any_file_content_gives_a_tagged_reward(content, solved):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ctrf.json"
        path.write_bytes(content)
        res = ctrf_reward(path, solved=solved)
        _check(res, solved)
        if len(content) < len(_VALID_TEXT.encode()) and _VALID_TEXT.encode().startswith(content):
            assert res.source in ("fallback:unparsable", "fallback:malformed"), res  # truncated


@SLOW_IO
@given(st.sampled_from(["missing", "dir", "nul", "fifo-free", "unreadable"]), solved_values)
@example("nul", True)
def test_odd_paths_give_a_tagged_reward(kind, solved):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ctrf.json"
        arg: object = path
        if kind == "dir":
            path.mkdir()
        elif kind == "nul":
            arg = str(path) + "\x00.json"
        elif kind == "fifo-free":
            arg = os.fsencode(path)  # bytes are neither a str path nor a dict
        elif kind == "unreadable":
            path.write_text(_VALID_TEXT)
            path.chmod(0)
        _check(ctrf_reward(arg, solved=solved), solved)


@FAST
@given(json_values, solved_values | json_values)
@example(True, None)
def test_bad_scale_or_solved_is_a_reward_error_naming_the_argument(scale, solved):
    with only_t1ops_errors(RewardError) as caught:
        res = ctrf_reward(VALID, solved=solved, scale=scale)
    if caught:
        assert "scale" in str(caught[0]) or "solved" in str(caught[0])
    else:
        assert not isinstance(scale, bool) and scale > 0 and solved in (None, True, False)
        assert res.value == 2 / scale
