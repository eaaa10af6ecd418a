"""Rewards that cannot lie: which file, written by the task's own verifier, decides the reward.

Order (docs/tasks.md):

1. **CTRF** (``pytest --ctrf``): reward = passed tests / S (report section 06), source ``ctrf``.
2. **Harbor's reward file** in the verifier dir: ``reward.json`` (an object whose numeric
   ``reward`` key is the reward) or else ``reward.txt`` (one number); source
   ``harbor-reward``. This is what real Harbor ``test.sh`` scripts write, often after a
   ``pytest --ctrf`` run and before an unconditional ``exit 0``.
3. Neither: reward 0, source ``no-verdict``. **An exit code alone is never a reward**: a
   script that exits 0 having written nothing scores 0, and the run summary counts it.

The report's rule still holds: a task whose own verdict says solved never scores 0. A
CTRF report of zero passes next to a positive Harbor reward takes the Harbor reward.
Files must have been written during this verifier run (mtime inside the run); a file
older than the run is somebody else's verdict and is not read. A reward file that no file
of the task's tests/ names was not written by the task's verifier: the verifier records
it as a tamper event (``foreign-verdict``), which voids the trial.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.rewards import RewardResult, ctrf_reward

SOURCE_CTRF = "ctrf"
SOURCE_HARBOR = "harbor-reward"
SOURCE_NO_VERDICT = "no-verdict"
MAX_REWARD_FILE_BYTES = 64 * 1024
MAX_ABS_REWARD = 1e6      # a finite, sane number; Harbor rewards are usually 0..1
_MTIME_SLACK_S = 2.0


@dataclass(frozen=True)
class HarborReward:
    """A reward read from ``reward.json`` / ``reward.txt``; ``extra`` keeps other numeric keys."""

    value: float
    file: str
    extra: dict[str, float]


class NoReward(Exception):
    """The reward file is absent or unusable; ``str(self)`` says which and why."""


def _read_small(path: Path, since_s: float | None) -> str:
    st = path.stat()
    if since_s is not None and st.st_mtime < since_s - _MTIME_SLACK_S:
        raise NoReward(f"{path.name} predates this verifier run; not this run's verdict")
    if st.st_size > MAX_REWARD_FILE_BYTES:
        raise NoReward(f"{path.name} is {st.st_size} bytes (> {MAX_REWARD_FILE_BYTES})")
    if st.st_size == 0:
        raise NoReward(f"{path.name} is empty")
    return path.read_text(encoding="utf-8", errors="replace")


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise NoReward(f"{what} is not a number ({v!r:.40})")
    if not math.isfinite(v) or abs(v) > MAX_ABS_REWARD:
        raise NoReward(f"{what} = {v!r} is not a finite reward")
    return float(v)


def read_harbor_reward(vdir: Path, *, since_s: float | None = None) -> HarborReward:
    """The Harbor reward in ``vdir`` (reward.json first, as Harbor does, then reward.txt),
    or :class:`NoReward` saying what was missing or wrong."""
    jpath, tpath = vdir / "reward.json", vdir / "reward.txt"
    problems = []
    if jpath.is_file() and not jpath.is_symlink():
        try:
            doc = json.loads(_read_small(jpath, since_s))
            if not isinstance(doc, dict):
                raise NoReward("reward.json is not a JSON object")
            extra = {k: float(v) for k, v in doc.items() if isinstance(v, (int, float))
                     and not isinstance(v, bool) and math.isfinite(v)}
            if "reward" in doc:
                return HarborReward(_number(doc["reward"], "reward.json 'reward'"), jpath.name, extra)
            problems.append("reward.json has no 'reward' key")
        except (NoReward, json.JSONDecodeError, RecursionError, OSError) as e:
            problems.append(f"reward.json unusable ({e})")
    if tpath.is_file() and not tpath.is_symlink():
        try:
            text = _read_small(tpath, since_s).strip()
            try:
                value = float(text)
            except ValueError:
                raise NoReward(f"reward.txt holds {text[:40]!r}, not a number") from None
            return HarborReward(_number(value, "reward.txt"), tpath.name, {})
        except (NoReward, OSError) as e:
            problems.append(str(e))
    raise NoReward("; ".join(problems) or "no reward.json or reward.txt in the verifier dir")


def decide(ctrf_doc: dict[str, Any] | None, ctrf_problem: str | None, vdir: Path, *,
           since_s: float | None, scale: float) -> RewardResult:
    """The reward from what the verifier wrote (see module doc). ``ctrf_doc`` is the accepted
    CTRF report (None if there was none or it was unusable: ``ctrf_problem`` says why)."""
    counted = ctrf_reward(ctrf_doc, solved=None, scale=scale) if ctrf_doc is not None else None
    # the report tags parse failures by source: why CTRF was not the reward, kept whatever decides it
    tag = "fallback:missing" if ctrf_doc is None and ctrf_problem in (None, "no CTRF report") else \
        "fallback:unparsable" if ctrf_doc is None else None
    if counted is not None and counted.source != SOURCE_CTRF:
        tag = counted.source
        ctrf_problem, counted = f"CTRF unusable ({counted.source}: {counted.detail})", None
    try:
        harbor = read_harbor_reward(vdir, since_s=since_s)
        harbor_problem = None
    except NoReward as e:
        harbor, harbor_problem = None, str(e)
    if counted is not None and (counted.passed or harbor is None or harbor.value <= 0):
        return counted
    if harbor is not None:
        why = (f"CTRF reports 0/{counted.total} passed but {harbor.file} says {harbor.value:g}; "
               "the task's own verdict wins" if counted is not None else f"from {harbor.file}")
        return RewardResult(harbor.value, SOURCE_HARBOR, None, None, why,
                            ctrf_fallback=tag if counted is None else "fallback:zero-pass")
    detail = "; ".join(p for p in (ctrf_problem or "no CTRF report", harbor_problem) if p)
    return RewardResult(0.0, SOURCE_NO_VERDICT, None, None,
                        f"no verdict ({detail}); an exit code alone is never a reward", ctrf_fallback=tag)


REWARD_FILES = ("reward.json", "reward.txt")


def foreign_reward_files(vdir: Path, tests_snapshot: dict[str, bytes]) -> list[str]:
    """Reward files in ``vdir`` that no file of the task's tests/ names. The task's own
    verifier writes only the files its scripts name; one nobody names was written by other
    code running during verification (the agent's), and is a forgery, not a verdict."""
    named = {f for f in REWARD_FILES if any(f.encode() in data for data in tests_snapshot.values())}
    return [f for f in REWARD_FILES if f not in named and ((vdir / f).exists() or (vdir / f).is_symlink())]


def no_verdict(detail: str) -> RewardResult:
    """Reward 0 tagged ``no-verdict`` (a verifier that timed out or hit a limit)."""
    return RewardResult(0.0, SOURCE_NO_VERDICT, None, None, detail, ctrf_fallback="fallback:verifier-limit")


def is_solved(reward: RewardResult) -> bool:
    """Whether the verdict says fully solved: every CTRF test passed, or a Harbor reward >= 1."""
    if reward.source == SOURCE_CTRF:
        return bool(reward.total) and reward.passed == reward.total
    return reward.source == SOURCE_HARBOR and reward.value >= 1.0
