"""`t1ops tasks generate`: Harbor task directories from parameterized families (docs/tasks.md,
"Task families"; the families are in t1ops/taskgen/families.py).

Deterministic: instance ``i`` of a family depends only on (family, seed, i), so the same
command writes byte-identical directories, and ``--start`` continues the same stream.
Within a family's stream no instruction repeats, so instances ``[0, N)`` (a training pool)
and ``[N, N + M)`` (its held-out pool, ``--start N``) never share a task: the campaign's
overlap check by name and by instruction passes by construction.
"""
from __future__ import annotations

from pathlib import Path

from t1ops.errors import ConfigError
from t1ops.taskgen.families import FAMILIES, Deck, Instance

MAX_TRIES_PER_INSTANCE = 200  # a family whose distinct instructions run out stops with a clear error

TASK_TOML = """version = "1.0"

[metadata]
family = "{family}"
difficulty = "{difficulty}"
tags = ["generated", "seed-{seed}"]

[agent]
timeout_sec = 30.0
max_turns = 4

[verifier]
timeout_sec = 60.0

[environment]
memory_mb = 512
allow_internet = false
required_env_keys = []
"""

TEST_SH = """#!/bin/bash
# Verifier for this task. Run by rl.agent.verifier AFTER the agent finishes, from a
# read-only copy of tests/; T1_* variables are set by the verifier, never by the agent.
cd "$T1_WORKSPACE" || exit 2
pytest -q -p no:cacheprovider --confcutdir="$T1_TESTS_DIR" --rootdir="$T1_TESTS_DIR" \\
  --ctrf "$T1_CTRF_PATH" "$T1_TESTS_DIR"
"""


def instances(family: str, count: int, seed: int, start: int = 0) -> list[tuple[str, Instance]]:
    """``(task name, instance)`` for instances ``start .. start + count - 1`` of ``family``."""
    if family not in FAMILIES:
        raise ConfigError(f"unknown task family {family!r}; known: {', '.join(sorted(FAMILIES))}",
                          key="family")
    if count < 1 or start < 0:
        raise ConfigError(f"--instances must be >= 1 and --start >= 0 (got {count}, {start})", key="instances")
    rng = Deck(f"t1ops-taskgen:{family}:{seed}")
    seen: set[str] = set()
    out: list[tuple[str, Instance]] = []
    tries = 0
    while len(seen) < start + count:
        inst = FAMILIES[family](rng)
        tries += 1
        if inst.instruction in seen:
            if tries > MAX_TRIES_PER_INSTANCE * (start + count):
                raise ConfigError(f"family {family!r} has fewer than {start + count} distinct instances "
                                  f"(found {len(seen)}); ask for fewer --instances or a lower --start",
                                  key="instances")
            continue
        seen.add(inst.instruction)
        index = len(seen) - 1
        if index >= start:
            out.append((f"{family}-{index:04d}", inst))
    return out


def write_task(root: Path, family: str, inst: Instance, seed: int) -> None:
    """One Harbor task directory (docs/tasks.md, "Layout"); file modes set explicitly."""
    (root / "environment").mkdir(parents=True)
    (root / "solution").mkdir()
    (root / "tests").mkdir()
    (root / "instruction.md").write_text(inst.instruction + "\n")
    (root / "task.toml").write_text(TASK_TOML.format(family=family, difficulty=inst.difficulty, seed=seed))
    for name, text in sorted(inst.files.items()):
        (root / "environment" / name).write_text(text)
    (root / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{inst.solution}\n")
    (root / "tests" / "test.sh").write_text(TEST_SH)
    (root / "tests" / "test_outputs.py").write_text(inst.tests)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() or p.suffix == ".sh" else 0o644)


def generate(families: list[str], count: int, seed: int, into: Path, start: int = 0) -> list[Path]:
    """Write ``count`` instances of each family into ``into``; refuses to overwrite a task."""
    planned = [(name, fam, inst) for fam in dict.fromkeys(families)
               for name, inst in instances(fam, count, seed, start)]
    into = Path(into)
    clash = sorted(name for name, _, _ in planned if (into / name).exists())
    if clash:
        raise ConfigError(f"{into} already holds {len(clash)} of these tasks ({', '.join(clash[:4])}...); "
                          "generate into an empty directory, or use --start to continue the stream",
                          key="into", path=str(into))
    into.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fam, inst in planned:
        write_task(into / name, fam, inst, seed)
        written.append(into / name)
    return written


__all__ = ["FAMILIES", "Instance", "generate", "instances", "write_task"]
