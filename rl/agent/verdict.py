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
  the counts of its ``results.tests`` list, and it counts only node ids collected from the
  task's own tests/ (``file::[Class::]test[param]``, rl/agent/collected.py), each once, no
  function with more instances than its parametrization gives (:func:`counted_report`,
  issue #51); so ``passed`` never exceeds the collected count;
- a report of zero tests, or no report where the task's verifier asked for one (``--ctrf``),
  is no verdict: reward 0, tagged, whatever a reward file says;
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.agent.bounded import BoundedReadError, read_regular
from rl.agent.collected import bound_of, collect
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
           reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE, expected: bool = False) -> RewardResult:
    """The reward from what the verifier wrote (see module doc). ``ctrf_doc`` is the accepted,
    counted CTRF report (:func:`counted_report`; None if there was none or it was unusable:
    ``ctrf_problem`` says why); ``expected``: the task's verifier asks for one
    (:func:`report_expected`). A report of zero tests, or none where one was expected, is no
    verdict whatever a reward file says. Evidence that contradicts itself raises
    :class:`InconsistentVerdict` (the verifier records it as a tamper event: reward 0)."""
    counted = ctrf_reward(ctrf_doc, solved=None, scale=scale) if ctrf_doc is not None else None
    # the report tags parse failures by source: why CTRF was not the reward, kept whatever decides it
    tag = "fallback:missing" if ctrf_doc is None and ctrf_problem in (None, "no CTRF report") else \
        "fallback:unparsable" if ctrf_doc is None else None
    if counted is not None and counted.source != SOURCE_CTRF:
        tag = counted.source
        ctrf_problem, counted = f"CTRF unusable ({counted.source}: {counted.detail})", None
    if (ctrf_doc is not None and counted is None) or (ctrf_doc is None and expected):
        why = ctrf_problem or "no CTRF report"
        return RewardResult(0.0, SOURCE_NO_VERDICT, None, None,
                            f"no verdict ({why}; the task's verifier asks for a CTRF report of its tests, so a "
                            "reward file cannot stand in for it)", ctrf_fallback=tag)
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


def counted_report(doc: dict[str, Any], tests_snapshot: dict[str, bytes]) -> tuple[dict[str, Any] | None, str | None]:
    """(the report as the verdict counts it, None) or (None, why it is not the pinned runner's
    own finished report on the task's tests).

    The summary must agree with the report's test list, and every test it lists must be a
    node id collected from the task's own files (rl/agent/collected.py), each at most once and
    no function with more instances than its parametrization gives. The counted report lists
    one entry per collected node id; a function t1ops cannot count statically is one entry,
    passed only if every instance listed passed. So ``passed`` <= the collected count."""
    results = doc["results"]
    summary, tests = results["summary"], results.get("tests", [])
    if summary.get("stop") is None:
        return None, "the CTRF report has no summary.stop: the run did not finish"
    counts = {"tests": len(tests), "passed": sum(t["status"] == "passed" for t in tests),
              "failed": sum(t["status"] == "failed" for t in tests)}
    for key, n in counts.items():
        if summary[key] != n:
            return None, f"summary.{key} = {summary[key]} but results.tests holds {n}"
    collected = collect(tests_snapshot)
    by_function: dict[str, list[str]] = {}
    names: set[str] = set()
    for t in tests:
        name = t.get("name")
        if not isinstance(name, str) or len(name) > 1024:
            return None, f"a test name is not a string of at most 1024 characters ({name!r:.60})"
        if name in names:
            return None, f"test {name!r:.120} is reported twice"
        names.add(name)
        found = bound_of(collected, name)
        if found is None:
            return None, f"test {name!r:.120} is no test collected from the task's tests/"
        base, n = found
        if n == 1 and "[" in name:
            return None, f"test {name!r:.120} carries parameters, but {base} is not parametrized"
        by_function.setdefault(base, []).append(t["status"])
    entries = []
    for base, statuses in by_function.items():
        n = collected.functions[base]
        if n is not None and len(statuses) > n:
            return None, (f"the report lists {len(statuses)} instances of {base!r:.120}, its "
                          f"parametrization gives {n}")
        if n is None:   # uncounted: one test, passed only if all its instances passed
            statuses = ["passed" if all(s == "passed" for s in statuses) else "failed"]
        entries += [{"name": base, "status": s} for s in statuses]
    counted = {"tests": len(entries), "passed": sum(e["status"] == "passed" for e in entries),
               "failed": sum(e["status"] == "failed" for e in entries),
               "start": summary.get("start"), "stop": summary.get("stop")}
    return {"results": {"summary": counted, "tests": entries}}, None


def report_expected(tests_snapshot: dict[str, bytes]) -> bool:
    """Whether the task's verifier asks for a CTRF report (a file of its tests/ says ``--ctrf``):
    then no report, or an unusable one, is no verdict whatever a reward file says."""
    return any(b"--ctrf" in data for data in tests_snapshot.values())


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
