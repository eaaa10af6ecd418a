"""Rewards that cannot lie: which file, written by the task's own verifier, decides the reward.

Order (docs/tasks.md):

1. **CTRF** (``pytest --ctrf``): reward = passed tests / S (report section 06), source ``ctrf``.
2. **Harbor's reward file** in the verifier dir: ``reward.json`` (an object whose numeric
   ``reward`` key is the reward) or else ``reward.txt`` (one number); source
   ``harbor-reward``. This is what real Harbor ``test.sh`` scripts write, often after a
   ``pytest --ctrf`` run and before an unconditional ``exit 0``.
3. Neither: reward 0, source ``no-verdict``. **An exit code alone is never a reward**: a
   script that exits 0 having written nothing scores 0, and the run summary counts it.

Bounds (issue #28; docs/sandbox.md "Verdict"): the evidence must agree or it is
``tampered`` (reward 0), never a larger reward:

- the CTRF report must be the pinned runner's own, finished run: its summary counts equal
  the counts of its ``results.tests`` list, and every test it names (``file::[Class::]test[param]``)
  is a test function defined in a file of the task's own tests/ (:func:`ctrf_problem`); so
  ``passed`` can never exceed what the task's tests can give;
- a reward file must hold a value inside the task's declared ``[verifier] reward_range``
  (default ``[0, 1]``), and next to a CTRF report it may not claim more than the report's
  passed share of that range (a positive reward file beside a zero-pass report is
  inconsistent evidence, not "the task's own verdict").

Files must have been written during this verifier run (mtime inside the run); a file
older than the run is somebody else's verdict and is not read. A reward file that no file
of the task's tests/ names was not written by the task's verifier: the verifier records
it as a tamper event (``foreign-verdict``), which voids the trial.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.agent.bounded import BoundedReadError, read_regular
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


class InconsistentVerdict(Exception):
    """The verifier's evidence contradicts itself or the task (``kind``: the tamper event)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


DEFAULT_REWARD_RANGE = (0.0, 1.0)


def _read_small(path: Path, since_s: float | None) -> str:
    try:
        data, st = read_regular(path, MAX_REWARD_FILE_BYTES)
    except BoundedReadError as e:
        raise NoReward(str(e)) from None
    if since_s is not None and st.st_mtime < since_s - _MTIME_SLACK_S:
        raise NoReward(f"{path.name} predates this verifier run; not this run's verdict")
    if not data:
        raise NoReward(f"{path.name} is empty")
    return data.decode("utf-8", errors="replace")


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
        except (NoReward, ValueError, RecursionError, OSError) as e:   # ValueError: int digits
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
           since_s: float | None, scale: float,
           reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE) -> RewardResult:
    """The reward from what the verifier wrote (see module doc). ``ctrf_doc`` is the accepted
    CTRF report (None if there was none or it was unusable: ``ctrf_problem`` says why).
    Evidence that contradicts itself raises :class:`InconsistentVerdict` (the verifier
    records it as a tamper event: reward 0)."""
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
    lo, hi = reward_range
    if harbor is not None and not lo <= harbor.value <= hi:
        raise InconsistentVerdict("reward-out-of-range", f"{harbor.file} says {harbor.value:g}, outside "
                                  f"the task's declared reward_range [{lo:g}, {hi:g}]")
    if counted is not None and harbor is not None and counted.total:
        ceiling = lo + (hi - lo) * counted.passed / counted.total
        if harbor.value > ceiling + 1e-9:
            raise InconsistentVerdict("inconsistent-verdict", f"{harbor.file} says {harbor.value:g} but the "
                                      f"CTRF report passed {counted.passed}/{counted.total} (at most "
                                      f"{ceiling:g}); the reward file claims more than the tests gave")
    if counted is not None and (counted.passed or harbor is None or harbor.value <= lo):
        return counted
    if harbor is not None:
        why = (f"CTRF reports 0/{counted.total} passed and {harbor.file} says {harbor.value:g}"
               if counted is not None else f"from {harbor.file}")
        return RewardResult(harbor.value, SOURCE_HARBOR, None, None, why,
                            ctrf_fallback=tag if counted is None else "fallback:zero-pass")
    detail = "; ".join(p for p in (ctrf_problem or "no CTRF report", harbor_problem) if p)
    return RewardResult(0.0, SOURCE_NO_VERDICT, None, None,
                        f"no verdict ({detail}); an exit code alone is never a reward", ctrf_fallback=tag)


_TEST_DEF = re.compile(rb"^[ \t]*(?:async[ \t]+)?def[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\(", re.M)


def ctrf_problem(doc: dict[str, Any], tests_snapshot: dict[str, bytes]) -> str | None:
    """Why ``doc`` is not the pinned runner's own finished report on the task's tests, or
    None: counts must match the tests list, names must be unique, and each test
    (``file.py::[Class::]name[param]``, relative to /tests) must be a function defined in
    that file of the task's tests/ snapshot."""
    results = doc["results"]
    summary, tests = results["summary"], results.get("tests", [])
    if summary.get("stop") is None:
        return "the CTRF report has no summary.stop: the run did not finish"
    counts = {"tests": len(tests), "passed": sum(t["status"] == "passed" for t in tests),
              "failed": sum(t["status"] == "failed" for t in tests)}
    for key, n in counts.items():
        if summary[key] != n:
            return f"summary.{key} = {summary[key]} but results.tests holds {n}"
    defined: dict[str, set[bytes]] = {}
    names: set[str] = set()
    for t in tests:
        name = t.get("name")
        if not isinstance(name, str) or len(name) > 1024:
            return f"a test name is not a string of at most 1024 characters ({name!r:.60})"
        if name in names:
            return f"test {name!r:.120} is reported twice"
        names.add(name)
        file, _, rest = name.partition("::")
        func = rest.rsplit("::", 1)[-1].split("[", 1)[0]
        file = file.removeprefix("/tests/").removeprefix("tests/")
        if file not in tests_snapshot:
            return f"test {name!r:.120} is in no file of the task's tests/"
        if file not in defined:
            defined[file] = set(_TEST_DEF.findall(tests_snapshot[file]))
        if not func or func.encode() not in defined[file]:
            return f"test {name!r:.120} names no function defined in tests/{file}"
    return None


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
