"""Issue #51's red team, one test per class (docs/sandbox.md "Classes closed by construction"):
each attack runs for real through ``verify`` as a hostile agent (commands in the trial) or a
hostile task author (``tests/``), on both environment backends where the class applies, and the
test asserts the rule's outcome: reward 0 with its tag, or the effect absent. Each holds the
issue's instance and at least one built here."""
from __future__ import annotations

from pathlib import Path

import pytest

from rl.agent.container.images import default_dockerfile
from rl.agent.tasks import load_task
from rl.agent.verifier import verify
from tests.rl.test_sandbox_attack_classes import _marker, _task, backend  # noqa: F401  (fixture)

PARAM_TESTS = '''import sys
from pathlib import Path

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


# --- the verifier's environment: only what the task declares (issue #51, class 3) ------------

# the default image (a Python base with the host's pytest) and the task's own ENV on top
IMAGE_ENV = (default_dockerfile() + "COPY in.txt /app/in.txt\n"
             "ENV BASH_ENV=/app/.rc PATH=/app/.venv/bin:/usr/local/bin:/usr/bin:/bin VIRTUAL_ENV=/app/.venv\n")


def test_class3_the_images_env_never_runs_the_agents_files(backend, tmp_path):
    """The issue's: the image's BASH_ENV and a PATH entry in /app/.venv/bin ran the agent's files
    in the container's verifier. Own: VIRTUAL_ENV naming /app/.venv reached it too."""
    mark = _marker()
    src = _task(tmp_path, 'echo "venv=$VIRTUAL_ENV" > /logs/verifier/env.txt\ngit --version >/dev/null 2>&1\n'
                'head -c0 in.txt 2>/dev/null\n' + RUN_PYTEST,
                files={"environment/Dockerfile": IMAGE_ENV})
    trial = backend().create(load_task(src), 0)
    plant = (f"sort in.txt > out.txt; echo 'touch /logs/verifier/{mark}-bashenv' > .rc; mkdir -p .venv/bin; "
             f"for t in git head; do printf '#!/bin/sh\\ntouch /logs/verifier/{mark}-$t\\n' "
             "> .venv/bin/$t; chmod +x .venv/bin/$t; done")
    assert trial.exec(plant).reason == "ok"
    v = verify(trial)
    vdir = trial.dir / "verifier"
    assert not [p.name for p in vdir.iterdir() if p.name.startswith(mark)]
    assert (vdir / "env.txt").read_text().strip() == "venv="
    assert (v.reason, v.reward.passed) == ("ok", 4), v
    trial.close()


def test_class3_verifier_env_applies_as_declared_and_startup_packages_are_refused(backend, tmp_path):
    """The issue's: [verifier.env] PYTHONPATH was overwritten on the container backend, and a
    sitecustomize *package* ran where the file name was blocked. Own: a usercustomize module
    in compiled form beside it."""
    mark = _marker()
    src = _task(tmp_path, 'echo "pp=$PYTHONPATH" > /logs/verifier/env.txt\n' + RUN_PYTEST,
                toml_extra='\n[verifier.env]\nPYTHONPATH = "/app/lib"\n')
    trial = backend().create(load_task(src), 0)
    assert trial.exec("sort in.txt > out.txt; mkdir -p lib/sitecustomize && "
                      f"echo \"open('/logs/verifier/{mark}', 'w')\" > lib/sitecustomize/__init__.py").reason == "ok"
    v = verify(trial)
    assert not (trial.dir / "verifier" / mark).exists()
    assert (v.reason, v.reward.source) == ("tamper", "tamper:shadow-module"), v
    trial.close()
    clean = backend(run_id="run-clean").create(load_task(src), 0)   # the declared dir itself is fine
    assert clean.exec("sort in.txt > out.txt; mkdir -p lib && echo 'X = 1' > lib/helper.py").reason == "ok"
    v = verify(clean)
    assert v.reason == "ok", v
    assert "/app/lib" in (clean.dir / "verifier" / "env.txt").read_text().strip().split("=", 1)[1].split(":")
    clean.close()


def test_class3_a_git_config_reached_through_commondir_is_judged(backend, tmp_path):
    """The issue's: a repository config reached through .git/commondir was never scanned and
    its clean filter ran in the verifier's `git status`. Own: the same through a worktree's
    commondir in a nested directory."""
    mark = _marker()
    test_sh = 'cd "$T1_WORKSPACE"\ngit status >/dev/null 2>&1; (cd sub && git status >/dev/null 2>&1)\n' + RUN_PYTEST
    trial = backend().create(load_task(_task(tmp_path, test_sh)), 0)
    common = (f"printf '[core]\\n\\trepositoryformatversion = 0\\n[filter \"x\"]\\n\\tclean = touch /logs/verifier/{mark}\\n'"
              " > data/common/config")
    cmd = ("sort in.txt > out.txt; mkdir -p data/common/objects data/common/refs .git sub/.git && " + common +
           " && echo 'ref: refs/heads/main' | tee .git/HEAD sub/.git/HEAD >/dev/null"
           " && echo /app/data/common > .git/commondir && echo ../../data/common > sub/.git/commondir"
           " && echo '* filter=x' > .gitattributes")
    assert trial.exec(cmd).reason == "ok"
    v = verify(trial)
    assert not (trial.dir / "verifier" / mark).exists()
    assert (v.reason, v.reward.source) == ("tamper", "tamper:tool-config"), v
    trial.close()


# --- Harbor's template verifier runs as its author wrote it (issue #51) -----------------------

@pytest.mark.heavy  # three container trials that install curl and uv from the registries: minutes, network-bound
def test_harbors_template_verifier_rewards_a_correct_solution_and_only_it(tmp_path):
    """Harbor's `tasks init` test.sh (apt-get curl, uv, `uvx ... pytest --ctrf`) verifies with
    --allow-internet: root of a fresh container of the task's image on an egress-only network.
    Fully rewarded for the oracle, 0 for a wrong solution; refused to run without the network."""
    import shutil
    import socket

    from t1ops.task_runs import run_paths
    from tests.rl.container_support import require_container_runtime

    require_container_runtime()
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError as e:
        pytest.skip(f"the package registry is unreachable from this host ({e})")
    src = tmp_path / "pool" / "harbor-template"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "harbor" / "container" / "harbor-template", src)
    [ok] = run_paths([src], oracle=True, allow_internet=True, trials_root=tmp_path / "t1", backend="container")
    assert (ok["solved"], ok["source"], ok["passed"], ok["total"]) == (True, "ctrf", 1, 1), ok
    (src / "solution" / "solve.sh").write_text("#!/bin/bash\nprintf 'c\\nb\\na\\n' > /app/sorted.txt\n")
    [wrong] = run_paths([src], oracle=True, allow_internet=True, trials_root=tmp_path / "t2", backend="container")
    assert (wrong["reward"], wrong["solved"], wrong["passed"]) == (0.0, False, 0), wrong
    [offline] = run_paths([src], oracle=True, trials_root=tmp_path / "t3", backend="container")
    assert offline["reward"] is None and "needs network" in offline["reason"], offline


def test_tasks_check_notes_a_parametrization_the_verdict_counts_as_one_test(tmp_path):
    from t1ops.task_import import do_check

    src = _task(tmp_path, files={"tests/test_outputs.py": "import pytest\n\n@pytest.mark.parametrize('x', load())\n"
                                                          "def test_dyn(x): pass\n\ndef test_plain(): pass\n"})
    [row] = do_check(src).ok
    assert [n for n in row["notes"] if "cannot be counted statically" in n] == [
        "test_outputs.py::test_dyn: its parameter sets cannot be counted statically; the verdict counts it as one "
        "test (docs/sandbox.md, issue #51)"]
