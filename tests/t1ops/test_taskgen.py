"""`t1ops tasks generate`: deterministic Harbor task families that `tasks check` and
`tasks run --oracle` accept, whose tests fail on a workspace nobody touched, and whose
committed pools (examples/families, the tiny campaign's) are exactly what the generator writes."""
from __future__ import annotations

from pathlib import Path

import pytest

from t1ops.cli import main
from t1ops.errors import ConfigError
from t1ops.task_import import do_check
from t1ops.task_runs import run_paths
from t1ops.taskgen import FAMILIES, generate, instances
from t1ops.taskgen.families import SOURCES, TARGETS, WORDS

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "examples" / "families"


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    return {p.relative_to(root).as_posix(): (p.stat().st_mode & 0o777, p.read_bytes() if p.is_file() else b"")
            for p in sorted(root.rglob("*"))}


def test_the_same_seed_writes_identical_directories_and_another_seed_does_not(tmp_path: Path):
    fams = sorted(FAMILIES)
    generate(fams, 3, 7, tmp_path / "a")
    generate(fams, 3, 7, tmp_path / "b")
    generate(fams, 3, 8, tmp_path / "c")
    a = tree(tmp_path / "a")
    assert len([k for k in a if k.endswith("instruction.md")]) == 3 * len(fams)
    assert a == tree(tmp_path / "b")
    assert a != tree(tmp_path / "c")
    assert a["sum-0000/solution/solve.sh"][0] == 0o755 and a["sum-0000/task.toml"][0] == 0o644


def test_start_continues_the_stream_so_held_out_instances_never_repeat_a_training_one():
    for fam in FAMILIES:
        whole = instances(fam, 9, 0)
        assert instances(fam, 4, 0, start=5) == whole[5:]
        assert len({inst.instruction for _, inst in whole}) == 9


def test_the_committed_pools_are_the_generators_output(tmp_path: Path):
    generate(["sum", "count", "grep", "sort", "rename"], 16, 0, tmp_path / "train")
    generate(["sum", "count", "grep", "sort", "rename"], 6, 0, tmp_path / "heldout", start=16)
    generate(["max"], 6, 0, tmp_path / "heldout")
    for pool in ("train", "heldout"):
        assert tree(tmp_path / pool) == tree(COMMITTED / pool), \
            f"examples/families/{pool} differs from the generator: regenerate it (examples/families/README.md)"


def test_generate_refuses_an_unknown_family_overwriting_and_an_exhausted_family(tmp_path: Path):
    with pytest.raises(ConfigError, match="unknown task family 'nope'.*known: count"):
        generate(["nope"], 1, 0, tmp_path)
    generate(["sum"], 2, 0, tmp_path)
    with pytest.raises(ConfigError, match="already holds 2 of these tasks.*--start"):
        generate(["sum"], 2, 0, tmp_path)
    with pytest.raises(ConfigError, match="fewer than 100 distinct instances"):
        instances("rename", 100, 0)


def test_generated_tasks_pass_check_the_oracle_solves_each_and_doing_nothing_does_not(tmp_path: Path):
    generate(sorted(FAMILIES), 1, 3, tmp_path / "pool")
    report = do_check(tmp_path / "pool")
    assert not report.refused and len(report.ok) == len(FAMILIES)
    assert all(r["runs_locally"] for r in report.ok)
    oracle = run_paths([tmp_path / "pool"], oracle=True, trials_root=tmp_path / "t1")
    assert [(r["source"], r["passed"], r["total"], r["solved"]) for r in oracle] == \
        [("ctrf", 4, 4, True)] * len(FAMILIES), oracle
    untouched = [tmp_path / "pool" / f"{fam}-0000" for fam in ("sum", "grep", "rename", "json")]  # each test style
    idle = run_paths(untouched, oracle=False, trials_root=tmp_path / "t2")
    assert all(r["source"] == "ctrf" and r["passed"] < r["total"] for r in idle), idle


def test_the_cli_writes_a_pool_and_lists_the_families(tmp_path: Path, capsys):
    assert main(["tasks", "generate", "grep", "json", "--instances", "2", "--into", str(tmp_path / "p")]) == 0
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["grep-0000", "grep-0001", "json-0000", "json-0001"]
    assert main(["tasks", "generate", "sum", "--instances", "1", "--start", "2", "--into", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "sum-0002").is_dir() and not (tmp_path / "p" / "sum-0000").exists()
    assert main(["tasks", "generate", "--list"]) == 0
    assert "rename   e.g. Rename" in capsys.readouterr().out
    assert main(["tasks", "generate", "nope", "--into", str(tmp_path / "q")]) == 1
    assert "unknown task family 'nope'" in capsys.readouterr().err


def test_names_are_single_tokens_and_held_out_solutions_fit_the_training_vocabulary():
    """What makes a held-out instance solvable by the tiny policy: every name is one token, so
    copying it from the instruction is one step, and every token of a held-out solution of a
    trained family is in the compact vocabulary built from the training pool."""
    from rl.agent.loop import sft_example, solution_command
    from rl.agent.tasks import load_pool
    from rl.chat import ChatRenderer
    from t1ops.campaign.launch import build_vocab

    renderer = ChatRenderer.default()
    for word in (*SOURCES, *TARGETS, *WORDS):
        assert len(renderer.encode(f" {word}")) == 1, word
    train = load_pool(COMMITTED / "train")
    vocab = build_vocab(train, renderer, 248_320)
    trained = {t.family for t in train}
    for t in load_pool(COMMITTED / "heldout"):
        if t.family in trained:
            tokens, mask = sft_example(t.instruction, solution_command(t.solution), renderer)
            vocab.encode_targets([tok for tok, m in zip(tokens, mask) if m])  # raises if one is missing
