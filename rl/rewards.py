"""Rewards: the CTRF test-count reward with tagged fallbacks (length shaping: rl/length_shaping.py).

T1 report, section 06. The verifier runs ``pytest --ctrf`` and writes a CTRF
JSON report; the reward is the absolute number of passed tests over a fixed
global scale ``S = 20`` ("S = 20 sits near the p90 of the pools' test-count
distribution": median 4, p90 ~19, max ~35), so a 40-pass task earns 2.0.
A missing or unusable report falls back to the binary terminal reward, so "a
genuinely solved task never scores zero", and the fallback's ``source`` says why.
CTRF files come from inside the sandbox: they are untrusted input and never crash
this module.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.errors import RewardError

DEFAULT_SCALE = 20.0            # report section 06: S = 20, ~p90 of test counts
BINARY_SOLVED_REWARD = 1.0      # the binary terminal reward a fallback uses
MAX_CTRF_BYTES = 64 * 2**20     # an agent can write anything; refuse to read a huge file
CTRF_STATUSES = ("passed", "failed", "skipped", "pending", "other")

SOURCE_CTRF = "ctrf"
FALLBACK_SOURCES = ("fallback:missing", "fallback:unreadable", "fallback:unparsable",
                    "fallback:malformed", "fallback:empty", "fallback:inconsistent")


@dataclass(frozen=True)
class RewardResult:
    """One trial's reward. ``source`` is ``ctrf`` or one of :data:`FALLBACK_SOURCES`;
    ``passed``/``total`` are the CTRF counts (None when the report was unusable);
    ``detail`` says what was wrong, for logs."""

    value: float
    source: str
    passed: int | None
    total: int | None
    detail: str = ""
    ctrf_fallback: str | None = None  # why CTRF was not the reward (a FALLBACK_SOURCES tag), None if it was

    @property
    def is_fallback(self) -> bool:
        return self.source != SOURCE_CTRF


class _Unusable(Exception):
    """Internal: the CTRF report cannot be used; ``source`` is the fallback tag."""

    def __init__(self, source: str, detail: str) -> None:
        super().__init__(detail)
        self.source, self.detail = source, detail


def _load(ctrf: Any) -> Any:
    if ctrf is None:
        raise _Unusable("fallback:missing", "no CTRF report was given")
    if isinstance(ctrf, dict):
        return ctrf
    if not isinstance(ctrf, (str, os.PathLike)):
        raise _Unusable("fallback:malformed", f"CTRF must be a path or a dict, got {type(ctrf).__name__}")
    path = Path(ctrf)
    if not path.exists():
        raise _Unusable("fallback:missing", f"{path} does not exist")
    try:
        if path.stat().st_size > MAX_CTRF_BYTES:
            raise _Unusable("fallback:unreadable", f"{path} is larger than {MAX_CTRF_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise _Unusable("fallback:unreadable", f"{path}: {err}") from err
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise _Unusable("fallback:unparsable", f"{path}: not JSON ({err}); truncated or corrupt") from err


def _count(summary: dict, key: str) -> int:
    v = summary.get(key)
    if type(v) is not int or v < 0:  # bool is an int subclass; a float count is not a count
        raise _Unusable("fallback:malformed", f"results.summary.{key} must be an int >= 0, got {v!r}")
    return v


def _counts(report: Any) -> tuple[int, int]:
    """(passed, total) from a parsed CTRF report, cross-checked against its test list."""
    results = report.get("results") if isinstance(report, dict) else None
    if not isinstance(results, dict):
        raise _Unusable("fallback:malformed", "CTRF has no 'results' object")
    summary, tests = results.get("summary"), results.get("tests")
    if not isinstance(summary, dict) or not isinstance(tests, list):
        raise _Unusable("fallback:malformed", "CTRF results need a 'summary' object and a 'tests' list")
    total, passed = _count(summary, "tests"), _count(summary, "passed")
    statuses = [t.get("status") if isinstance(t, dict) else None for t in tests]
    unknown = [s for s in statuses if s not in CTRF_STATUSES]
    if unknown:
        raise _Unusable("fallback:malformed", f"{len(unknown)} test entries have no valid status "
                        f"(first: {unknown[0]!r}; expected one of {CTRF_STATUSES})")
    if total == 0 and not tests:
        raise _Unusable("fallback:empty", "CTRF lists zero tests")
    listed_passed = statuses.count("passed")
    by_status = sum(_count(summary, k) for k in CTRF_STATUSES if k in summary)
    if total != len(tests) or passed != listed_passed or passed > total or by_status > total:
        raise _Unusable("fallback:inconsistent",
                        f"summary says {passed}/{total} passed but the test list has "
                        f"{listed_passed}/{len(tests)} (status counts sum to {by_status})")
    return passed, total


def ctrf_reward(ctrf: Any, *, solved: bool | None = None, scale: float = DEFAULT_SCALE) -> RewardResult:
    """Reward = passed tests / ``scale`` from a CTRF report (a path or a parsed dict).

    Absolute count, not a ratio (a ratio caps every task at 1.0), on a fixed
    global scale (a per-batch maximum would drift the critic's target). Any
    unusable report falls back to the binary terminal reward from ``solved``
    (1.0 / 0.0) with ``source`` saying why; a report that claims zero passes for
    a ``solved`` trial is ``fallback:inconsistent`` (a solved task never scores
    0). Without ``solved`` a fallback scores 0.0 and ``detail`` says so.
    ``scale`` <= 0 or not finite, or a non-bool ``solved``: RewardError.
    """
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise RewardError(f"scale must be a finite number > 0 (the report uses {DEFAULT_SCALE}), got {scale!r}",
                          argument="scale")
    if solved is not None and not isinstance(solved, bool):
        raise RewardError(f"solved must be True, False or None, got {solved!r} ({type(solved).__name__})",
                          argument="solved")
    try:
        passed, total = _counts(_load(ctrf))
        if passed == 0 and solved:
            raise _Unusable("fallback:inconsistent",
                            f"CTRF reports 0/{total} passed but the trial is solved")
    except _Unusable as bad:
        value = BINARY_SOLVED_REWARD if solved else 0.0
        note = "" if solved is not None else "; no terminal outcome given, scored 0.0"
        return RewardResult(value, bad.source, None, None, bad.detail + note, ctrf_fallback=bad.source)
    return RewardResult(passed / float(scale), SOURCE_CTRF, passed, total)
