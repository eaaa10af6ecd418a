"""The `heavy` marker (tests/conftest.py, docs/testing.md "Heavy tests"): the README's command (CI's)
leaves heavy tests out, `--heavy` runs them, and naming a heavy test's file runs it. A heavy test that
ran in CI anyway would only cost minutes; one that never ran anywhere would be a check nobody makes."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = "tests/rl/test_verdict_by_construction.py::test_harbors_template_verifier_rewards_a_correct_solution_and_only_it"


def _collected(*args: str) -> tuple[list[str], str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-n", "0", "-p", "no:cacheprovider", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line.split("@", 1)[0] for line in out.stdout.splitlines() if "::" in line], out.stdout


def test_heavy_tests_are_left_out_of_the_default_run_and_counted():
    ids, text = _collected("tests/rl/")
    assert ids and HEAVY not in ids
    assert re.search(r"\(\d+ deselected\)", text), text[-500:]


def test_heavy_runs_them_and_naming_the_file_runs_them():
    ids, _ = _collected("tests/rl/", "--heavy", "-m", "heavy")
    assert HEAVY in ids
    assert all(i.startswith("tests/rl/") for i in ids)
    ids, _ = _collected(HEAVY.split("::")[0])
    assert HEAVY in ids
