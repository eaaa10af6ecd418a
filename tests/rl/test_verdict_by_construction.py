"""Issue #51's red team, one test per class (docs/sandbox.md "Classes closed by construction"):
each attack runs for real through ``verify`` as a hostile agent (commands in the trial) or a
hostile task author (``tests/``), on both environment backends where the class applies, and the
test asserts the rule's outcome: reward 0 with its tag, or the effect absent. Each holds the
issue's instance and at least one built here."""
from __future__ import annotations

import pytest

from rl.agent.tasks import load_task
from rl.agent.verifier import verify
from tests.rl.test_sandbox_attack_classes import _marker, _task, backend  # noqa: F401  (fixture)

PARAM_TESTS = '''import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("word", ["apple", "banana"])
def test_word(word):
    assert word in Path("out.txt").read_text().split()


def test_sorted():
    lines = Path("out.txt").read_text().splitlines()
    assert lines and lines == sorted(lines)
'''
RUN_PYTEST = 'cd "$T1_WORKSPACE"\npython3 -m pytest -q -p no:cacheprovider --ctrf "$T1_CTRF_PATH" "$T1_TESTS_DIR"\n'
HARBOR_TAIL = 'if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n'
FORGE = ('python3 - <<EOF\nimport json, time\nt = int(time.time() * 1000)\n'
         'tests = [{{"name": f"test_outputs.py::{name}[{{i}}]", "status": "passed"}} for i in range({n})]\n'
         'json.dump({{"results": {{"summary": {{"tests": {n}, "passed": {n}, "failed": 0, "start": t, '
         '"stop": t}}, "tests": tests}}}}, open("/logs/verifier/ctrf.json", "w"))\nEOF\n')


def _param_task(tmp_path, test_sh: str, extra: dict[str, str] | None = None):
    return load_task(_task(tmp_path, test_sh, files={"tests/test_outputs.py": PARAM_TESTS, **(extra or {})}))


@pytest.mark.parametrize("forge", [
    FORGE.format(name="test_word", n=400),     # the issue's: 400 ids of one parametrised name
    FORGE.format(name="test_sorted", n=3),     # own: parameters on a test that has none
], ids=["issue-400-ids-of-one-name", "own-params-on-a-plain-test"])
def test_class2_a_report_counts_only_collected_node_ids(backend, tmp_path, forge):
    """The tested code rewrites the report after the real run (it runs as the verifier)."""
    trial = backend().create(_param_task(tmp_path, RUN_PYTEST + forge), 0)
    assert trial.exec("sort in.txt > out.txt").reason == "ok"
    v = verify(trial)
    assert (v.reward.value, v.reason, v.reward.source) == (0.0, "tamper", "tamper:ctrf-inconsistent"), v
    trial.close()


def test_class2_the_honest_run_counts_every_parameter_set_once(backend, tmp_path):
    trial = backend().create(_param_task(tmp_path, RUN_PYTEST), 0)
    assert trial.exec("sort in.txt > out.txt").reason == "ok"
    v = verify(trial)
    assert (v.reason, v.reward.source, v.reward.passed, v.reward.total) == ("ok", "ctrf", 3, 3), v
    trial.close()


@pytest.mark.parametrize("case", ["exit-before-report", "empty-report"])
def test_class2_no_report_or_an_empty_one_is_no_verdict(backend, tmp_path, case):
    """The issue's: pytest exits 0 before writing its report (the tested code calls os._exit(0))
    and Harbor's tail writes reward.txt = 1. Own: a finished report of zero tests beside
    reward.txt = 1 (a test file whose tests the tested code skips at import)."""
    if case == "exit-before-report":
        extra = {"tests/test_outputs.py": "import sys\nsys.path.insert(0, '/app')\nimport solution\n\n" + PARAM_TESTS}
        agent = "sort in.txt > out.txt; echo 'import os; os._exit(0)' > solution.py"
        test_sh = RUN_PYTEST + HARBOR_TAIL
    else:
        extra = {}
        agent = "sort in.txt > out.txt"
        test_sh = ('python3 - <<EOF\nimport json, time\nt = int(time.time() * 1000)\njson.dump({"results": '
                   '{"summary": {"tests": 0, "passed": 0, "failed": 0, "start": t, "stop": t}, "tests": []}}, '
                   'open("/logs/verifier/ctrf.json", "w"))\nEOF\necho 1 > /logs/verifier/reward.txt  # --ctrf\n')
    trial = backend().create(_param_task(tmp_path, test_sh, extra), 0)
    assert trial.exec(agent).reason == "ok"
    v = verify(trial)
    assert (v.reward.value, v.reward.source, v.reason) == (0.0, "no-verdict", "no-verdict"), v
    assert v.reward.ctrf_fallback == ("fallback:missing" if case == "exit-before-report" else "fallback:empty")
    trial.close()
