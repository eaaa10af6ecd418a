"""The older Terminal-Bench task layout, converted to the Harbor layout on import.

Terminal-Bench 1 tasks look like::

    task.yaml  Dockerfile  docker-compose.yaml  run-tests.sh  solution.sh  tests/  <files>

and are converted in place (docs/tasks.md) to::

    instruction.md      task.yaml's ``instruction`` (or its first ``descriptions`` entry)
    task.toml           metadata, ``max_agent_timeout_sec`` / ``max_test_timeout_sec``
    environment/        the Dockerfile, docker-compose.yaml and every other build file
    solution/solve.sh   solution.sh (or the commands of solution.yaml)
    tests/run-tests.sh  the task's own test runner, unchanged
    tests/test.sh       runs run-tests.sh with ``--ctrf /logs/verifier/ctrf.json`` added to
                        every pytest run (PYTEST_ADDOPTS), so pytest's own report is the verdict

Only tasks graded by Terminal-Bench's ``pytest`` parser convert; any other parser is
refused with that reason (its verdict cannot be read without Terminal-Bench itself).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from rl.errors import TaskError

_KEPT_AT_ROOT = {"task.yaml", "run-tests.sh", "solution.sh", "solution.yaml", "tests"}
TEST_SH = """#!/bin/bash
# Converted from the Terminal-Bench layout by `t1ops tasks import` (docs/tasks.md).
# The task's own run-tests.sh runs unchanged; PYTEST_ADDOPTS makes each pytest run write
# its CTRF report, which is the verdict (no report: reward 0, tagged no-verdict).
export TEST_DIR=/tests
mkdir -p /logs/verifier
export PYTEST_ADDOPTS="--ctrf /logs/verifier/ctrf.json ${PYTEST_ADDOPTS:-}"
bash /tests/run-tests.sh
"""


def is_legacy(root: Path) -> bool:
    """A Terminal-Bench 1 task: task.yaml and no task.toml."""
    return (root / "task.yaml").is_file() and not (root / "task.toml").exists()


def _load(root: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load((root / "task.yaml").read_text(errors="replace"))
    except yaml.YAMLError as e:
        raise TaskError(f"{root}/task.yaml: not valid YAML ({e})", path=str(root)) from e
    if not isinstance(data, dict):
        raise TaskError(f"{root}/task.yaml: expected a mapping", path=str(root))
    return data


def _instruction(data: dict[str, Any], root: Path) -> str:
    text = data.get("instruction")
    if not text and isinstance(data.get("descriptions"), list) and data["descriptions"]:
        first = data["descriptions"][0]
        text = first.get("description") if isinstance(first, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise TaskError(f"{root}/task.yaml has no 'instruction' text; cannot convert",
                        path=str(root))
    return text


def _toml(data: dict[str, Any]) -> str:
    lines = ['version = "1.0"', "", "[metadata]",
             'converted_from = "terminal-bench task.yaml"']
    for key in ("author_name", "author_email", "difficulty", "category"):
        if isinstance(data.get(key), str):
            lines.append(f"{key} = {json.dumps(data[key])}")
    tags = data.get("tags")
    if isinstance(tags, list) and all(isinstance(t, str) for t in tags):
        lines.append(f"tags = {json.dumps(tags)}")
    for section, key in (("agent", "max_agent_timeout_sec"), ("verifier", "max_test_timeout_sec")):
        v = data.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            lines += ["", f"[{section}]", f"timeout_sec = {float(v)}"]
    return "\n".join(lines) + "\n"


def _solution(root: Path) -> str | None:
    if (root / "solution.sh").is_file():
        return (root / "solution.sh").read_text(errors="replace")
    if (root / "solution.yaml").is_file():
        steps = yaml.safe_load((root / "solution.yaml").read_text(errors="replace"))
        cmds = [s.get("command") for s in steps or [] if isinstance(s, dict)]
        if cmds and all(isinstance(c, str) for c in cmds):
            return "#!/bin/bash\n" + "\n".join(c.rstrip("\n") for c in cmds) + "\n"
    return None


def convert(root: Path) -> list[str]:
    """Rewrite the Terminal-Bench task at ``root`` into the Harbor layout, in place.
    Returns notes on what was done; TaskError (nothing changed) when it cannot convert."""
    data = _load(root)
    parser = data.get("parser_name", "pytest")
    if parser != "pytest":
        raise TaskError(f"{root}: Terminal-Bench parser {parser!r} cannot be converted (only "
                        "'pytest' is); write tests/test.sh that writes /logs/verifier/reward.txt",
                        path=str(root))
    if not (root / "run-tests.sh").is_file():
        raise TaskError(f"{root}: older Terminal-Bench layout without run-tests.sh; cannot "
                        "convert", path=str(root))
    instruction = _instruction(data, root)
    solution = _solution(root)
    notes = ["converted from the Terminal-Bench layout (task.yaml)"]
    env_dir = root / "environment"
    env_dir.mkdir(exist_ok=True)
    for entry in sorted(root.iterdir()):
        if entry.name not in _KEPT_AT_ROOT and entry != env_dir:
            shutil.move(str(entry), str(env_dir / entry.name))
    (root / "tests").mkdir(exist_ok=True)
    shutil.move(str(root / "run-tests.sh"), str(root / "tests" / "run-tests.sh"))
    (root / "tests" / "test.sh").write_text(TEST_SH)
    if solution is not None:
        (root / "solution").mkdir(exist_ok=True)
        (root / "solution" / "solve.sh").write_text(solution)
    else:
        notes.append("no solution.sh: the task has no reference solution")
    for old in ("solution.sh", "solution.yaml"):
        (root / old).unlink(missing_ok=True)
    (root / "instruction.md").write_text(instruction.rstrip("\n") + "\n")
    (root / "task.toml").write_text(_toml(data))
    (root / "task.yaml").unlink()      # all of it now lives in task.toml and instruction.md
    return notes
