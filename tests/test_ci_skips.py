"""In CI a skipped test fails unless its reason names a GPU (tests/conftest.py); locally it stays a skip."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
TESTS = '''
import pytest
pytestmark = pytest.mark.skipif({module_skip}, reason="no sglang wheel")

def test_missing_dependency():
    pytest.skip("pyarrow is not installed")

def test_gpu_only():
    pytest.skip("needs a CUDA GPU")

def test_runs():
    assert True
'''


def _run(tmp_path: Path, ci: str | None, module_skip: bool = False) -> subprocess.CompletedProcess:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(TESTS.format(module_skip=module_skip))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", [None, "true"])
def test_a_skip_fails_in_ci_unless_it_names_a_gpu(tmp_path: Path, ci: str | None) -> None:
    out = _run(tmp_path, ci)
    summary = out.stdout.strip().splitlines()[-1]
    if ci is None:
        assert out.returncode == 0 and "1 passed, 2 skipped" in summary, out.stdout
    else:
        assert out.returncode == 1 and "1 failed, 1 passed, 1 skipped" in summary, out.stdout
        assert "skipped in CI (pyarrow is not installed)" in out.stdout


def test_a_module_skipped_in_ci_fails(tmp_path: Path) -> None:
    out = _run(tmp_path, "true", module_skip=True)
    assert out.returncode == 1 and "3 errors" in out.stdout.strip().splitlines()[-1], out.stdout  # at setup
    assert "skipped in CI (no sglang wheel)" in out.stdout
