"""The suite's scheduling (tests/conftest.py): a module's fast tests, and every reader of one session
fixture, run on one xdist worker. Nothing fails when grouping breaks, it only costs minutes: the
shared two-node campaign ran twice, once per worker, because xdist's hook turned the marks into
"@group" node ids before tests/conftest.py had added them, and pytest 9.2's structured node ids
ignore xdist 3.8's rewrite (pytest-xdist#1386). docs/testing.md, "Flakes"."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_modules_fast_tests_share_one_worker_and_carry_their_group():
    module = "tests/t1ops/test_quiet_start.py"
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider", module,
                          "-k", "auth_notice or worker_env"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})
    ran = re.findall(r"\[(gw\d+)\].*PASSED (\S+)", out.stdout)
    assert len(ran) == 2, out.stdout[-2000:]
    assert all(nodeid.endswith(f"@{module}") for _, nodeid in ran), ran  # xdist read our group
    assert len({worker for worker, _ in ran}) == 1, ran
