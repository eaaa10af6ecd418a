"""The chaos suite's stability figure: run it N times under K busy cores of background load.

A guardrail that catches its fault on an idle laptop and misses it on a loaded CI runner is
not a guardrail. ``t1ops chaos soak --repeat N --load K`` runs every scenario N times while K
background processes spin on the CPU (real contention for the scenario's processes, not a
simulated clock), then prints each scenario's pass rate and the spread of its detection time
(min / median / max), and the reason of every failed run. A flaky scenario shows up as a pass
rate below 100%; its failure reasons say which invariant broke.
"""
from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from chaos import harness
from chaos.report import failure_reason, format_seconds


def _spin(stop) -> None:  # a busy core; exits when the parent sets ``stop``
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


@contextmanager
def background_load(num_cores: int) -> Iterator[list[int]]:
    """``num_cores`` spinning processes for the duration of the block (their pids are yielded)."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop,), daemon=True, name=f"chaos-load-{i}") for i in range(num_cores)]
    for p in procs:
        p.start()
    try:
        yield [p.pid for p in procs]
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


@dataclass
class ScenarioSoak:
    """Every run of one scenario in a soak."""

    id: str
    passed: list[bool] = field(default_factory=list)
    detection_s: list[float] = field(default_factory=list)
    recover_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    lost: tuple[int, int] | None = None   # steps, trials lost (the last passing run's)

    @property
    def pass_rate(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    def spread(self, what: str = "detection_s") -> tuple[float, float, float] | None:
        d = getattr(self, what)
        return (min(d), statistics.median(d), max(d)) if d else None

    def to_dict(self) -> dict:
        out = {"id": self.id, "runs": len(self.passed), "passed": sum(self.passed),
               "pass_rate": self.pass_rate, "failures": self.failures,
               "steps_lost": None if self.lost is None else self.lost[0],
               "trials_lost": None if self.lost is None else self.lost[1]}
        for what in ("detection_s", "recover_s"):
            spread = self.spread(what)
            out[what] = None if spread is None else dict(zip(("min", "median", "max"), spread))
        return out


def soak(ids: list[str], repeat: int, load: int,
         run: Callable[[str], harness.ScenarioResult] = harness.run_scenario,
         progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
         ) -> list[ScenarioSoak]:
    """Run ``ids`` ``repeat`` times (round-robin, so load and time of day spread evenly)."""
    if repeat < 1 or load < 0:
        raise ValueError(f"soak needs repeat >= 1 and load >= 0 (got repeat={repeat}, load={load})")
    books = {sid: ScenarioSoak(sid) for sid in ids}
    t0 = time.monotonic()
    with background_load(load):
        for rnd in range(1, repeat + 1):
            for sid in ids:
                r = run(sid)
                b = books[sid]
                b.passed.append(r.passed)
                if r.passed and r.guarded.detection_s is not None:
                    b.detection_s.append(r.guarded.detection_s)
                if r.passed and r.recovery is not None and r.recovery.measured:
                    if r.recovery.recover_s is not None:  # a run stopped by design: its losses, no recovery time
                        b.recover_s.append(r.recovery.recover_s)
                    b.lost = (r.recovery.steps_lost, r.recovery.trials_lost)
                if not r.passed:
                    b.failures.append(f"round {rnd}: {failure_reason(r)}")
                progress(f"[{time.monotonic() - t0:7.1f} s] round {rnd}/{repeat} {sid}: "
                         f"{'pass' if r.passed else 'FAIL'} ({r.duration_s:.1f} s)")
    return list(books.values())


def _spread_text(s: tuple[float, float, float] | None) -> str:
    return "-" if s is None else " / ".join(format_seconds(v) for v in s)


def table_lines(books: list[ScenarioSoak], repeat: int, load: int) -> list[str]:
    """A plain-text table: id, pass rate, detection min / median / max."""
    lines = [f"chaos soak: {repeat} round(s) with {load} busy core(s) of background load",
             f"{'id':28} {'pass':>9} {'detection min / median / max':>36} {'recovery min / median / max':>36}"
             "  lost steps/trials"]
    for b in books:
        det, rec = (_spread_text(b.spread(w)) for w in ("detection_s", "recover_s"))
        lost = "-" if b.lost is None else f"{b.lost[0]}/{b.lost[1]}"
        lines.append(f"{b.id:28} {sum(b.passed):>3}/{len(b.passed):<3} {b.pass_rate:>4.0%} {det:>30} {rec:>36}"
                     f"  {lost}")
        lines.extend(f"    {f}" for f in b.failures)
    total = sum(len(b.passed) for b in books)
    ok = sum(sum(b.passed) for b in books)
    lines.append(f"{ok}/{total} runs passed; {sum(b.pass_rate == 1.0 for b in books)}/{len(books)} scenarios at 100%")
    return lines
