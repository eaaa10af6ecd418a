"""Chaos harness core: the scenario registry, the result shape, the runner.

A scenario reproduces one failure of the catalogue in docs/failures.md. It injects a
real fault through a seam the code already has (a process, a socket, an
rlimit, a file, a clock), runs once with the guardrail off and once with it
on, and reports what it *observed*:

- ``fault_fired``: the fault really happened (observed, never assumed);
- ``unguarded``: the failure signature with the guardrail off;
- ``guarded``: whether the guardrail caught it, how fast, and the text a user sees;
- ``invariants``: named checks that must hold (e.g. "no sample lost");
- ``recovery``: the fault's time to detect and time to recover, and the steps or trials it cost
  (:class:`Recovery`, filled from a :class:`Timeline` the scenario marks as the fault happens,
  the guard names it, and the first healthy step (or the resume) follows; where the guard stops
  the run by design and the restart is not measurable here, the time the run stopped with the
  named error). Every scenario must mark one: a result without it fails (invariant
  ``recovery measured``), so no row of the table says "not measured" silently.

``passed`` = fault fired, the unguarded run really failed (at least one invariant whose name
starts with ``unguarded`` states how, observed), the guardrail caught it, and every invariant held.

Scenario modules live in ``chaos/scenarios/`` and call :func:`register` at
import time; :func:`discover` imports them all.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

RUNBOOK_DIR = Path(__file__).resolve().parent.parent / "runbooks"


@dataclass
class Guarded:
    """What happened with the guardrail on."""

    caught: bool
    detection_s: float | None = None
    error: str = ""


@dataclass
class Recovery:
    """Time to detect and time to recover for one injected fault, measured from the fault.

    ``detect_s``: fault -> the guard's detection; ``recover_s``: fault -> the first healthy step
    (a trained step, a served request, a resumed run's first step); ``steps_lost`` and
    ``trials_lost``: the work the fault cost (re-run or dropped); ``how``: what the recovery was
    ("in place", "resume", "re-sync", "refused before the run", ...); ``stopped_s``: fault -> the run
    stopped with the guard's named error, for a guard that stops the run by design (its restart is the
    runbook's, not measured here when ``recover_s`` is None).
    """

    detect_s: float | None
    recover_s: float | None
    steps_lost: int = 0
    trials_lost: int = 0
    how: str = ""
    stopped_s: float | None = None

    @property
    def measured(self) -> bool:
        """Detected, and then recovered or stopped with the named error (each timed from the fault)."""
        return self.detect_s is not None and (self.recover_s is not None or self.stopped_s is not None)


class Timeline:
    """Marks taken while a scenario runs: ``fault()``, ``detected()``, ``healthy()``, ``stopped()``
    (monotonic; ``stopped``: the run ended with the guard's named error, by design).

    The first mark of each kind counts; :meth:`recovery` turns them into a :class:`Recovery`.
    """

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}

    def _mark(self, kind: str, at: float | None) -> None:
        self.marks.setdefault(kind, time.monotonic() if at is None else at)

    def fault(self, at: float | None = None) -> None:
        self._mark("fault", at)

    def detected(self, at: float | None = None) -> None:
        self._mark("detected", at)

    def healthy(self, at: float | None = None) -> None:
        self._mark("healthy", at)

    def stopped(self, at: float | None = None) -> None:
        self._mark("stopped", at)

    def after_fault(self, **seconds: float | None) -> None:
        """Marks timed by the scenario itself, in seconds after the fault mark (e.g. a rank process's own
        clock): ``tl.after_fault(detected=0.4, healthy=2.1)``; a None is left unmarked."""
        for kind, s in seconds.items():
            if s is not None:
                self._mark(kind, self.marks["fault"] + s)

    def since_fault(self, kind: str) -> float | None:
        if "fault" not in self.marks or kind not in self.marks:
            return None
        return max(0.0, self.marks[kind] - self.marks["fault"])

    def recovery(self, *, steps_lost: int = 0, trials_lost: int = 0, how: str = "") -> Recovery:
        return Recovery(detect_s=self.since_fault("detected"), recover_s=self.since_fault("healthy"),
                        steps_lost=steps_lost, trials_lost=trials_lost, how=how,
                        stopped_s=self.since_fault("stopped"))


@dataclass
class ScenarioResult:
    id: str
    title: str
    runbook: str
    fault_fired: bool
    unguarded: str
    guarded: Guarded
    invariants: dict[str, bool] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    crashed: str | None = None
    recovery: Recovery | None = None

    @property
    def passed(self) -> bool:
        return (self.crashed is None and self.fault_fired and self.guarded.caught and self.unguarded_asserted
                and all(self.invariants.values()))

    @property
    def unguarded_asserted(self) -> bool:
        """The bug side is an observed, asserted fact, not only a printed sentence."""
        return any(k.lower().startswith("unguarded") for k in self.invariants)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["passed"] = self.passed
        return d


@dataclass
class Outcome:
    """What a scenario's ``run`` returns; the harness adds id, title, timing."""

    fault_fired: bool
    unguarded: str
    guarded: Guarded
    invariants: dict[str, bool] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    recovery: Recovery | None = None


@dataclass(frozen=True)
class Scenario:
    id: str            # the catalogue id in docs/failures.md, also the runbook's file name
    title: str         # one line
    run: Callable[[Path], Outcome]  # takes a scratch directory

    @property
    def runbook(self) -> str:
        return f"runbooks/{self.id}.md"


_REGISTRY: dict[str, Scenario] = {}


def register(id: str, title: str) -> Callable[[Callable[[Path], Outcome]], Callable[[Path], Outcome]]:
    """Decorator: ``@register("dead-engine", "an engine dies mid-campaign")``."""

    def wrap(fn: Callable[[Path], Outcome]) -> Callable[[Path], Outcome]:
        if id in _REGISTRY and _REGISTRY[id].run is not fn:
            raise ValueError(f"chaos scenario id {id!r} registered twice")
        _REGISTRY[id] = Scenario(id=id, title=title, run=fn)
        return fn

    return wrap


def discover(include_private: bool = False) -> dict[str, Scenario]:
    """Import every module in ``chaos.scenarios`` and return the registry.

    Ids starting with ``_`` (harness self-tests) are left out unless asked for.
    """
    import chaos.scenarios as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"chaos.scenarios.{mod.name}")
    return {k: v for k, v in sorted(_REGISTRY.items()) if include_private or not k.startswith("_")}


def run_scenario(scenario_id: str, workdir: Path | None = None) -> ScenarioResult:
    """Run one scenario in a scratch directory; a crash is a failed result, not an exception."""
    scenarios = discover(include_private=True)
    if scenario_id not in scenarios:
        known = ", ".join(scenarios) or "(none)"
        raise KeyError(f"unknown chaos scenario {scenario_id!r}; known: {known}")
    sc = scenarios[scenario_id]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"chaos-{sc.id}-", dir=workdir) as tmp:
        try:
            out = sc.run(Path(tmp))
            crashed = None
        except Exception:  # a scenario that crashes has failed; keep the traceback
            out = Outcome(fault_fired=False, unguarded="", guarded=Guarded(caught=False))
            crashed = traceback.format_exc()
    recovery = out.recovery or _detection_only(out)
    invariants = out.invariants if crashed else {**out.invariants, RECOVERY_MEASURED: recovery.measured}
    return ScenarioResult(id=sc.id, title=sc.title, runbook=sc.runbook, fault_fired=out.fault_fired,
                          unguarded=out.unguarded, guarded=out.guarded, invariants=invariants,
                          details=out.details, duration_s=round(time.monotonic() - t0, 3),
                          crashed=crashed, recovery=recovery)


RECOVERY_MEASURED = "recovery measured (fault -> detected -> recovered or stopped)"
NOT_MEASURED = "NOT MEASURED: the scenario marks no timeline"


def _detection_only(out: Outcome) -> Recovery:
    """A scenario that marks no timeline: its detection time at most; the result fails (RECOVERY_MEASURED)."""
    return Recovery(detect_s=out.guarded.detection_s, recover_s=None, how=NOT_MEASURED)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run ``fn`` and return (result or raised exception, elapsed seconds)."""
    t0 = time.monotonic()
    try:
        res = fn()
    except Exception as err:  # the caller inspects what was raised
        res = err
    return res, time.monotonic() - t0
