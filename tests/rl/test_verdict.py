"""The verdict rules (rl/agent/verdict.py): CTRF, then Harbor's reward files, else no-verdict."""
from __future__ import annotations

import json
import os
import time

import pytest

from rl.agent.collected import collect
from rl.agent.verdict import (InconsistentVerdict, NoReward, counted_report, decide, is_solved,
                              read_harbor_reward)

CTRF_0 = {"results": {"summary": {"tests": 2, "passed": 0, "failed": 2},
                      "tests": [{"name": "a", "status": "failed"}, {"name": "b", "status": "failed"}]}}
CTRF_2 = {"results": {"summary": {"tests": 2, "passed": 2, "failed": 0},
                      "tests": [{"name": "a", "status": "passed"}, {"name": "b", "status": "passed"}]}}


def test_ctrf_first_then_harbor_then_no_verdict(tmp_path):
    r = decide(CTRF_2, None, tmp_path, since_s=None, scale=20)
    assert (r.source, r.passed, r.value) == ("ctrf", 2, 0.1) and is_solved(r)
    assert decide(None, "no CTRF report", tmp_path, since_s=None, scale=20).source == "no-verdict"
    (tmp_path / "reward.txt").write_text("1\n")
    r = decide(None, "no CTRF report", tmp_path, since_s=None, scale=20)
    assert (r.source, r.value) == ("harbor-reward", 1.0) and is_solved(r)
    with pytest.raises(InconsistentVerdict, match="claims more than the tests gave"):
        decide(CTRF_0, None, tmp_path, since_s=None, scale=20)   # 0/2 passed, the file says 1
    (tmp_path / "reward.txt").write_text("0\n")
    r = decide(CTRF_0, None, tmp_path, since_s=None, scale=20)
    assert (r.source, r.value, r.passed) == ("ctrf", 0.0, 0) and not is_solved(r)


@pytest.mark.parametrize("name, text", [
    ("reward.txt", "nan"), ("reward.txt", "inf"), ("reward.txt", ""), ("reward.txt", "yes"),
    ("reward.json", "[1]"), ("reward.json", '{"reward": true}'), ("reward.json", '{"score": 1}'),
    ("reward.json", "{bad json"),
])
def test_unusable_reward_files_are_no_verdict(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(NoReward):
        read_harbor_reward(tmp_path)
    r = decide(None, None, tmp_path, since_s=None, scale=20)
    assert (r.source, r.value) == ("no-verdict", 0.0)


def test_reward_json_wins_and_a_file_older_than_the_run_is_not_read(tmp_path):
    (tmp_path / "reward.json").write_text(json.dumps({"reward": 0.25, "extra": 2}))
    (tmp_path / "reward.txt").write_text("1")
    got = read_harbor_reward(tmp_path)
    assert (got.value, got.file, got.extra["extra"]) == (0.25, "reward.json", 2.0)
    old = time.time() - 3600
    for f in ("reward.json", "reward.txt"):
        os.utime(tmp_path / f, (old, old))
    with pytest.raises(NoReward, match="predates"):
        read_harbor_reward(tmp_path, since_s=time.time())


@pytest.mark.parametrize("text, kind", [("1000000", "reward-out-of-range"), ("-1", "reward-out-of-range"),
                                        ("1.5", "reward-out-of-range")])
def test_a_reward_file_outside_the_declared_range_is_inconsistent(tmp_path, text, kind):
    (tmp_path / "reward.txt").write_text(text)
    with pytest.raises(InconsistentVerdict) as e:
        decide(None, None, tmp_path, since_s=None, scale=20)
    assert e.value.kind == kind
    r = decide(None, None, tmp_path, since_s=None, scale=20, reward_range=(-2.0, 2e6))
    assert r.value == float(text)


def ctrf_problem(doc, tests):
    return counted_report(doc, tests)[1]


def report(*tests, stop=2):
    """A CTRF report listing ``tests`` ((name, status) pairs) with matching counts."""
    listed = [{"name": n, "status": st} for n, st in tests]
    return {"results": {"summary": {"tests": len(listed), "passed": sum(st == "passed" for _, st in tests),
                                    "failed": sum(st == "failed" for _, st in tests), "start": 1, "stop": stop},
                        "tests": listed}}


def test_a_ctrf_report_must_name_the_tasks_own_tests(tmp_path):
    tests = {"test_outputs.py": b"import x\n\ndef test_a():\n    pass\n\nclass TestB:\n    def test_b(self):\n        pass\n"}
    ok = report(("test_outputs.py::test_a", "passed"), ("test_outputs.py::TestB::test_b", "failed"))
    assert ctrf_problem(ok, tests) is None
    forged = report(("test_outputs.py::test_zzz", "passed"))
    assert "no test collected" in ctrf_problem(forged, tests)
    twice = report(*[("test_outputs.py::test_a", "passed")] * 2)
    assert "twice" in ctrf_problem(twice, tests)
    lying = {"results": {"summary": {"tests": 5, "passed": 5, "failed": 0, "start": 1, "stop": 2},
                         "tests": [{"name": "test_outputs.py::test_a", "status": "passed"}]}}
    assert "summary.tests" in ctrf_problem(lying, tests)
    unfinished = {"results": {"summary": {"tests": 0, "passed": 0, "failed": 0, "start": 1}, "tests": []}}
    assert "did not finish" in ctrf_problem(unfinished, tests)


# issue #51, class 2: a report counts only node ids collected from the task's own files


PARAM_TESTS = {"test_outputs.py": b"""import pytest

@pytest.mark.parametrize("n", [1, 2])
def test_a(n):
    assert n

def test_b():
    pass

def helper_not_a_test():
    pass
"""}


def test_forged_parameter_ids_of_one_parametrised_name_are_refused():
    """The issue's instance: 400 forged ids of one parametrised name earned 20.0 on a two-test task."""
    forged = report(*[(f"test_outputs.py::test_a[{i}]", "passed") for i in range(400)])
    assert "parametrization gives 2" in ctrf_problem(forged, PARAM_TESTS)
    real = report(("test_outputs.py::test_a[1]", "passed"), ("test_outputs.py::test_a[2]", "passed"),
                  ("test_outputs.py::test_b", "passed"))
    doc, bad = counted_report(real, PARAM_TESTS)
    assert bad is None and doc["results"]["summary"]["passed"] == 3


@pytest.mark.parametrize("name, why", [
    ("test_outputs.py::test_b[x]", "not parametrized"),            # parameters on a plain test
    ("test_outputs.py::helper_not_a_test", "no test collected"),   # a def pytest would not collect
    ("test_outputs.py::TestA::test_a[1]", "no test collected"),    # a class that does not exist
    ("conftest.py::test_a", "no test collected"),                  # conftest holds no tests
    ("other.py::test_a[1]", "no test collected"),
])
def test_ids_that_pytest_would_not_collect_are_refused(name, why):
    assert why in ctrf_problem(report((name, "passed")), {**PARAM_TESTS, "conftest.py": b"def test_a(): pass\n"})


def test_parameter_sets_are_counted_through_marks_fixtures_and_names():
    """Own instances: stacked marks multiply, a module-level list, range(), a fixture's params
    (in conftest.py, transitively), a class mark and pytestmark all count; values computed at
    run time make the function one test, passed only if every instance passed."""
    src = b"""import pytest
CASES = [(1, 2), (3, 4), (5, 6)]
pytestmark = [pytest.mark.slow]

@pytest.mark.parametrize("a", [1, 2])
@pytest.mark.parametrize("b", range(3))
def test_grid(a, b): pass

@pytest.mark.parametrize("a,b", CASES)
def test_named(a, b): pass

def test_fixture(flavour): pass

@pytest.mark.parametrize("x", [1, 2])
class TestK:
    def test_m(self, x): pass

@pytest.mark.parametrize("x", load_cases())
def test_dynamic(x): pass
"""
    conf = b"""import pytest
@pytest.fixture(params=["a", "b"])
def base(request): return request.param
@pytest.fixture
def flavour(base): return base
"""
    c = collect({"test_x.py": src, "conftest.py": conf}).functions
    assert c == {"test_x.py::test_grid": 6, "test_x.py::test_named": 3, "test_x.py::test_fixture": 2,
                 "test_x.py::TestK::test_m": 2, "test_x.py::test_dynamic": None}
    many = report(*[(f"test_x.py::test_dynamic[{i}]", "passed") for i in range(50)])
    doc, bad = counted_report(many, {"test_x.py": src, "conftest.py": conf})
    assert bad is None and (doc["results"]["summary"]["tests"], doc["results"]["summary"]["passed"]) == (1, 1)
    one_failed = report(("test_x.py::test_dynamic[0]", "passed"), ("test_x.py::test_dynamic[1]", "failed"))
    assert counted_report(one_failed, {"test_x.py": src})[0]["results"]["summary"]["passed"] == 0


def test_unittest_cases_and_ids_from_another_rootdir_are_collected():
    src = b"import unittest\n\nclass Checks(unittest.TestCase):\n    def test_one(self): pass\n    def helper(self): pass\n"
    assert collect({"sub/test_u.py": src}).functions == {"sub/test_u.py::Checks::test_one": 1}
    for name in ("sub/test_u.py::Checks::test_one", "../tests/sub/test_u.py::Checks::test_one",
                 "/tests/sub/test_u.py::Checks::test_one"):
        assert ctrf_problem(report((name, "passed")), {"sub/test_u.py": src}) is None, name


def test_a_generate_tests_hook_makes_its_files_uncounted():
    src = b"def pytest_generate_tests(metafunc): pass\n\ndef test_a(x): pass\n"
    assert collect({"test_h.py": src}).functions == {"test_h.py::test_a": None}


def test_the_tasks_own_ini_names_its_test_functions():
    tests = {"pytest.ini": b"[pytest]\npython_functions = check_*\n", "test_c.py": b"def check_one(): pass\ndef test_no(): pass\n"}
    assert collect(tests).functions == {"test_c.py::check_one": 1}


def test_an_empty_report_is_no_verdict_whatever_the_reward_file_says(tmp_path):
    """The issue's instance: a finished CTRF report of zero tests skipped the reward-file ceiling."""
    (tmp_path / "reward.txt").write_text("1\n")
    empty, bad = counted_report(report(), PARAM_TESTS)
    assert bad is None
    r = decide(empty, None, tmp_path, since_s=None, scale=20, expected=True)
    assert (r.source, r.value, r.ctrf_fallback) == ("no-verdict", 0.0, "fallback:empty")
    r = decide(empty, None, tmp_path, since_s=None, scale=20, expected=False)   # own: even unasked
    assert (r.source, r.value) == ("no-verdict", 0.0)


@pytest.mark.parametrize("problem, tag", [("no CTRF report", "fallback:missing"),
                                          ("ctrf.json: not JSON (truncated)", "fallback:unparsable")])
def test_no_report_where_the_verifier_asked_for_one_is_no_verdict(tmp_path, problem, tag):
    """The issue's instance: a pytest that exits 0 before writing its report let reward.txt
    decide; own instance: a truncated report beside reward.txt = 1."""
    (tmp_path / "reward.txt").write_text("1\n")
    r = decide(None, problem, tmp_path, since_s=None, scale=20, expected=True)
    assert (r.source, r.value, r.ctrf_fallback) == ("no-verdict", 0.0, tag)
    r = decide(None, problem, tmp_path, since_s=None, scale=20, expected=False)   # a reward-file-only task
    assert (r.source, r.value) == ("harbor-reward", 1.0)
