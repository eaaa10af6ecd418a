"""Parameterized task families: many instances of one skill (docs/tasks.md, "Task families").

A family is a function ``Deck -> Instance`` (a seeded RNG that also deals names). Instances of a family differ in file
names, values and sizes; each carries its instruction, its workspace files, a
one-line reference solution and four CTRF tests (so a half-right attempt earns
part of the reward: the right output file with the wrong value passes one or
two tests, not zero or four).

Names come from small pools of words that the Qwen tokenizer reads as one token
each (" data", " total", ...; checked by tests/test_taskgen.py), and an
instruction names a file exactly as its solution does. A tiny policy can then
learn a family as "this command, with the names copied from the instruction",
and what it learns on some instances applies to new ones: held-out instances
of a trained family share its skill, a held-out family does not.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Callable

SOURCES = ("data", "input", "notes", "items", "list", "values", "records", "lines")
TARGETS = ("out", "result", "answer", "report", "output", "total", "summary", "final")
WORDS = ("error", "warn", "fail", "ok", "skip", "retry")
KEYS = ("name", "version", "owner", "status", "region", "level")
FILLER = ("alpha", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "mike",
          "oscar", "papa", "sierra", "tango", "victor", "zulu")


@dataclass(frozen=True)
class Instance:
    """One generated task: what ``write_task`` turns into a Harbor task directory."""

    instruction: str
    files: dict[str, str]        # workspace files (environment/), name -> text
    solution: str                # one bash command line
    tests: str                   # tests/test_outputs.py
    difficulty: str = "easy"


class Deck(random.Random):
    """A seeded RNG that also deals words from a pool as from a shuffled deck: every word of a
    pool comes once before any comes twice, so the first ``len(pool)`` instances of a family
    cover its pool (a training pool holds every name its held-out instances use)."""

    def __init__(self, seed: str) -> None:
        super().__init__(seed)
        self._decks: dict[tuple[str, ...], list[str]] = {}

    def deal(self, pool: tuple[str, ...]) -> str:
        deck = self._decks.setdefault(pool, [])
        if not deck:
            deck.extend(self.sample(pool, len(pool)))
        return deck.pop()


def _names(rng: Deck) -> tuple[str, str]:
    """A source file name from SOURCES and a target from TARGETS, each dealt from its deck."""
    return f"{rng.deal(SOURCES)}.txt", f"{rng.deal(TARGETS)}.txt"


def _lines(items) -> str:
    return "".join(f"{x}\n" for x in items)


def _value_tests(out: str, check: str, expected: str) -> str:
    """Four tests on a one-line answer file: exists, one line, its form (``check``), its value."""
    return (
        "from pathlib import Path\n\n"
        f"OUT = Path({out!r})\n\n"
        "def test_exists():\n    assert OUT.is_file()\n\n"
        "def test_single_line():\n    assert len(OUT.read_text().splitlines()) == 1\n\n"
        f"def test_form():\n    assert {check}\n\n"
        f"def test_value():\n    assert OUT.read_text().strip() == {expected!r}\n"
    )


def _lines_tests(out: str, expected: list[str], shape: str) -> str:
    """Four tests on a many-line answer file: exists, its shape (``shape``), line count, exact text."""
    return (
        "from pathlib import Path\n\n"
        f"OUT = Path({out!r})\n"
        f"EXPECTED = {expected!r}\n\n"
        "def test_exists():\n    assert OUT.is_file()\n\n"
        f"def test_shape():\n    lines = OUT.read_text().splitlines()\n    assert {shape}\n\n"
        "def test_count():\n    assert len(OUT.read_text().splitlines()) == len(EXPECTED)\n\n"
        "def test_exact():\n    assert OUT.read_text() == ''.join(l + '\\n' for l in EXPECTED)\n"
    )


def sum_family(rng: Deck) -> Instance:
    src, dst = _names(rng)
    nums = [rng.randint(1, 99) for _ in range(rng.randint(3, 9))]
    return Instance(f"Write the sum of the numbers in {src} (one per line) to {dst}.", {src: _lines(nums)},
                    f"paste -sd+ {src} | bc > {dst}",
                    _value_tests(dst, "OUT.read_text().strip().isdigit()", str(sum(nums))))


def count_family(rng: Deck) -> Instance:
    src, dst = _names(rng)
    rows = [rng.choice(FILLER) for _ in range(rng.randint(2, 12))]
    return Instance(f"Write the number of lines in {src} to {dst}.", {src: _lines(rows)},
                    f"wc -l < {src} > {dst}",
                    _value_tests(dst, "OUT.read_text().strip().isdigit()", str(len(rows))))


def max_family(rng: Deck) -> Instance:
    src, dst = _names(rng)
    nums = rng.sample(range(1, 500), rng.randint(3, 9))
    return Instance(f"Write the largest number in {src} to {dst}.", {src: _lines(nums)},
                    f"sort -n {src} | tail -n 1 > {dst}",
                    _value_tests(dst, "OUT.read_text().strip().isdigit()", str(max(nums))))


def grep_family(rng: Deck) -> Instance:
    src, dst = _names(rng)
    word = rng.deal(WORDS)
    others = [w for w in WORDS if w != word]
    n = rng.randint(4, 9)
    hits = set(rng.sample(range(n), rng.randint(1, n - 2)))
    rows = [f"{word if i in hits else rng.choice(others)}: {rng.choice(FILLER)} {i}" for i in range(n)]
    expected = [r for r in rows if word in r]
    return Instance(f"Write every line of {src} that contains the word {word} to {dst}.",
                    {src: _lines(rows)}, f"grep {word} {src} > {dst}",
                    _lines_tests(dst, expected, f"lines and all({word!r} in l for l in lines)"))


def sort_family(rng: Deck) -> Instance:
    src, dst = _names(rng)
    rows = rng.sample(FILLER, rng.randint(3, 9))
    return Instance(f"Sort the lines of {src} alphabetically and write them to {dst}.",
                    {src: _lines(rows)}, f"sort {src} > {dst}",
                    _lines_tests(dst, sorted(rows), "lines == sorted(lines)"))


def head_family(rng: Deck) -> Instance:
    src, dst = _names(rng)
    rows = [rng.choice(FILLER) for _ in range(rng.randint(6, 10))]
    n = rng.randint(2, 5)
    return Instance(f"Write the first {n} lines of {src} to {dst}.", {src: _lines(rows)},
                    f"head -n {n} {src} > {dst}",
                    _lines_tests(dst, rows[:n], f"lines == {rows!r}[:len(lines)]"))


def rename_family(rng: Deck) -> Instance:
    src, dst = _names(rng)
    body = _lines(rng.sample(FILLER, rng.randint(1, 4)))
    tests = (
        "from pathlib import Path\n\n"
        f"SRC, DST, BODY = Path({src!r}), Path({dst!r}), {body!r}\n\n"
        "def test_exists():\n    assert DST.is_file()\n\n"
        "def test_source_gone():\n    assert not SRC.exists()\n\n"
        "def test_content():\n    assert DST.read_text() == BODY\n\n"
        "def test_only_file():\n    assert sorted(p.name for p in Path('.').iterdir() if p.suffix == '.txt')"
        " == [DST.name]\n"
    )
    return Instance(f"Rename {src} to {dst}.", {src: body}, f"mv {src} {dst}", tests)


def json_family(rng: Deck) -> Instance:
    src, dst = _names(rng)
    src = src.replace(".txt", ".json")
    key = rng.deal(KEYS)
    keys = [key, *rng.sample([k for k in KEYS if k != key], rng.randint(1, 3))]
    rng.shuffle(keys)
    doc = {k: f"{rng.choice(FILLER)}{rng.randint(1, 9)}" for k in keys}
    return Instance(f'Write the value of the "{key}" field of {src} to {dst} (no quotes).',
                    {src: json.dumps(doc) + "\n"}, f"jq -r .{key} {src} > {dst}",
                    _value_tests(dst, "'\"' not in OUT.read_text()", doc[key]))


FAMILIES: dict[str, Callable[[Deck], Instance]] = {
    "sum": sum_family, "count": count_family, "max": max_family, "grep": grep_family,
    "sort": sort_family, "head": head_family, "rename": rename_family, "json": json_family,
}
