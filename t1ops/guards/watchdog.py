"""Progress watchdog: tell a warm-up from a straggler from a hang.

Report, section 09: a "hang" (15 NCCL watchdog timeouts + one silent rank) was
one rank cold-compiling kernels for >30 minutes while its expert-parallel peers
waited in the all-to-all; per-micro-batch times decayed 489 s -> 22 s, the
fingerprint of a warm-up curve, not of a deadlock.

Ranks call :meth:`Watchdog.report` once per finished micro-batch. The
watchdog learns its hang bound from what it has seen, as NVIDIA's resiliency
tooling does: ``bound = safety_factor x longest observed interval`` (any rank),
never below ``min_bound_s``; a rank that has not finished its first
micro-batch gets ``first_step_bound_s`` (cold compile). Per rank:

- ``hung``: silent longer than the bound -> stacks dumped, :class:`HangError`;
- ``warming_up``: no micro-batch yet, or intervals decaying (longest >=
  ``warmup_ratio`` x latest and not yet flat);
- ``straggler``: pace slower than ``straggler_factor`` x the peers' median;
- ``ok`` otherwise.

A warm-up can never be called ``hung``: while intervals decay, the silence of
the micro-batch in progress is at most the previous interval, which is at most
the longest, which is at most the bound. The clock is injectable.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal

from t1ops import telemetry
from t1ops.config import GuardsConfig
from t1ops.errors import HangError, InputError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "slow-verifier": ("guards.field.verifier_timeout_cap_s", "guards.stall_timeout_s"),
    "jit-as-deadlock": ("guards.watchdog_safety_factor", "guards.watchdog_first_step_bound_s", "guards.watchdog_min_bound_s", "guards.watchdog_warmup_ratio", "guards.nccl_timeout_min"),
}

RUNBOOK = "runbooks/jit-as-deadlock.md"
Status = Literal["ok", "warming_up", "straggler", "hung"]
#: Intervals within this ratio of each other over the last three micro-batches are "flat".
STEADY_SPREAD = 1.25


@dataclass(frozen=True)
class RankState:
    """One rank's classification at one instant."""

    rank: int
    status: Status
    step: int
    silent_s: float
    bound_s: float
    intervals_s: tuple[float, ...]
    reason: str


@dataclass
class _Rank:
    last_t: float
    step: int = -1
    intervals_s: list[float] = field(default_factory=list)
    status: Status = "warming_up"
    dump: str | None = None


def is_warming_up(intervals_s: list[float] | tuple[float, ...], warmup_ratio: float) -> bool:
    """Decaying and not yet flat: longest >= ratio x latest, last three not within 25%."""
    if len(intervals_s) < 2 or max(intervals_s) < warmup_ratio * intervals_s[-1]:
        return False
    tail = intervals_s[-3:]
    return len(tail) < 3 or max(tail) > STEADY_SPREAD * min(tail)


class Watchdog:
    """Classify ranks from their per-micro-batch progress reports.

    Not thread-safe: call :meth:`report` and :meth:`check` from one thread
    (the coordinator's loop) or under one lock.
    """

    def __init__(self, ranks: Iterable[int], *, safety_factor: float = 3.0, first_step_bound_s: float = 7200.0,
                 min_bound_s: float = 60.0, warmup_ratio: float = 2.0, straggler_factor: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 dump_stacks: Callable[[int], str | None] | None = None, unit: str = "micro-batch") -> None:
        if safety_factor < 1:
            raise InputError(f"Watchdog(safety_factor={safety_factor}) must be >= 1: a bound below the "
                             "longest observed interval calls normal steps hangs", safety_factor=safety_factor)
        self.safety_factor, self.first_step_bound_s, self.min_bound_s = safety_factor, first_step_bound_s, min_bound_s
        self.warmup_ratio, self.straggler_factor = warmup_ratio, straggler_factor
        self._clock, self._dump_stacks = clock, dump_stacks
        self.unit = unit  # what one report is: a rank's micro-batch, or the 1-rank trainer's whole step
        now = clock()
        self._ranks = {int(r): _Rank(last_t=now) for r in ranks}
        if not self._ranks:
            raise InputError("Watchdog(ranks=[]) watches nothing; pass the rank ids", ranks=[])

    @classmethod
    def from_config(cls, guards: GuardsConfig, ranks: Iterable[int], clock: Callable[[], float] = time.monotonic,
                    dump_stacks: Callable[[int], str | None] | None = None, unit: str = "micro-batch") -> "Watchdog":
        """Build from a :class:`~t1ops.config.GuardsConfig`."""
        return cls(ranks, safety_factor=guards.watchdog_safety_factor,
                   first_step_bound_s=guards.watchdog_first_step_bound_s, min_bound_s=guards.watchdog_min_bound_s,
                   warmup_ratio=guards.watchdog_warmup_ratio, straggler_factor=guards.watchdog_straggler_factor,
                   clock=clock, dump_stacks=dump_stacks, unit=unit)

    def report(self, rank: int, step: int) -> None:
        """Rank ``rank`` finished micro-batch ``step``; a step that does not advance is not progress."""
        r = self._ranks.get(rank)
        if r is None:
            raise InputError(f"Watchdog.report(rank={rank}): unknown rank; watched ranks are "
                             f"{sorted(self._ranks)}", rank=rank)
        if step <= r.step:
            return
        now = self._clock()
        r.intervals_s.append(now - r.last_t)
        r.last_t, r.step, r.dump = now, step, None
        telemetry.observe("watchdog.interval_s", r.intervals_s[-1], rank=rank)

    def restart_clock(self, rank: int) -> None:
        """Rank ``rank`` is handed new work now: its silence is timed from here, and the idle time
        before (rollout, weight sync) is not a micro-batch interval (it would inflate the bound)."""
        r = self._ranks.get(rank)
        if r is None:
            raise InputError(f"Watchdog.restart_clock(rank={rank}): unknown rank; watched ranks are "
                             f"{sorted(self._ranks)}", rank=rank)
        r.last_t = self._clock()

    def longest_interval_s(self) -> float | None:
        ivs = [max(r.intervals_s) for r in self._ranks.values() if r.intervals_s]
        return max(ivs) if ivs else None

    def bound_s(self, rank: int) -> float:
        """Silence after which ``rank`` is hung."""
        longest = self.longest_interval_s()
        if longest is None or not self._ranks[rank].intervals_s:
            return self.first_step_bound_s
        return max(self.min_bound_s, self.safety_factor * longest)

    def classify(self) -> dict[int, RankState]:
        """Current state of every rank; emits an event on each status change, dumps stacks on ``hung``."""
        now = self._clock()
        paces = {k: max(r.intervals_s[-1], now - r.last_t) for k, r in self._ranks.items() if r.intervals_s}
        out: dict[int, RankState] = {}
        for k, r in self._ranks.items():
            status, reason = self._status(k, r, now, paces)
            if status != r.status:
                self._on_change(k, r, status, reason)
            r.status = status
            out[k] = RankState(k, status, r.step, now - r.last_t, self.bound_s(k), tuple(r.intervals_s), reason)
        return out

    def _status(self, k: int, r: _Rank, now: float, paces: dict[int, float]) -> tuple[Status, str]:
        silent, bound = now - r.last_t, self.bound_s(k)
        if silent > bound:
            basis = (f"{self.safety_factor:g} x longest interval {self.longest_interval_s():.1f} s"
                     if r.intervals_s else "first-step bound")
            return "hung", f"no progress for {silent:.1f} s > bound {bound:.1f} s ({basis})"
        if not r.intervals_s:
            return "warming_up", f"first {self.unit} in progress for {silent:.1f} s (cold start/compile)"
        if is_warming_up(r.intervals_s, self.warmup_ratio):
            return "warming_up", f"{self.unit} time decaying {max(r.intervals_s):.1f} s -> {r.intervals_s[-1]:.1f} s"
        peers = [p for j, p in paces.items() if j != k]
        if peers and paces[k] > self.straggler_factor * statistics.median(peers):
            return "straggler", f"pace {paces[k]:.1f} s vs peers' median {statistics.median(peers):.1f} s"
        return "ok", f"last interval {r.intervals_s[-1]:.1f} s"

    def _on_change(self, k: int, r: _Rank, status: Status, reason: str) -> None:
        severity = {"ok": "info", "warming_up": "info", "straggler": "warn", "hung": "error"}[status]
        if status == "hung" and self._dump_stacks is not None:
            r.dump = self._dump_stacks(k)
        telemetry.event(f"watchdog.{status}", severity, rank=k, step=r.step, reason=reason,
                        stacks=r.dump, runbook=RUNBOOK)

    def check(self) -> dict[int, RankState]:
        """:meth:`classify`, raising :class:`HangError` if any rank is ``hung``."""
        states = self.classify()
        hung = [s for s in states.values() if s.status == "hung"]
        if not hung:
            return states
        others = ", ".join(f"rank {s.rank} {s.status}" for s in states.values() if s.status != "hung")
        lines = [f"rank {s.rank} hung at {self.unit} {s.step}: {s.reason}; intervals so far "
                 f"{[round(x, 1) for x in s.intervals_s]}; stacks: {self._ranks[s.rank].dump or 'not dumped'}"
                 for s in hung]
        raise HangError("; ".join(lines) + f". Not a warm-up: its intervals were not decaying. Others: "
                        f"{others or 'none'}. See {RUNBOOK}.", ranks=[s.rank for s in hung],
                        silent_s=[s.silent_s for s in hung], bound_s=[s.bound_s for s in hung])


VERIFIER_RUNBOOK = "runbooks/slow-verifier.md"


def running_verifiers(trials_root: str | Path, limit: int = 3) -> list[str]:
    """Stall causes naming the verifiers running under ``trials_root`` (oldest first; task, trial,
    pid, time run of its budget): a step that waits on a slow reward function is not a hung trainer
    or a dead network (slow-verifier; verl issue #6673). Event ``watchdog.verifier_running``."""
    from rl.agent import verifying

    entries = verifying.in_flight(Path(trials_root))
    lines = []
    for e in entries[:limit]:
        over = "PAST its budget" if e["elapsed_s"] > e["budget_s"] else "within its budget"
        lines.append(f"{verifying.describe(e)} ({over}): the step waits on a slow verifier (reward function), not "
                     f"on the trainer or the network; it is killed at its budget "
                     f"(guards.field.verifier_timeout_cap_s caps the task's). See {VERIFIER_RUNBOOK}")
        telemetry.event("watchdog.verifier_running", "warn", task=e["task"], trial=e["trial_id"],
                        pids=e.get("pids"), elapsed_s=e["elapsed_s"], budget_s=e["budget_s"],
                        runbook=VERIFIER_RUNBOOK)
    if len(entries) > limit:
        lines.append(f"and {len(entries) - limit} more verifiers running")
    return lines


def install_stack_dump(path: str | Path, signum: int = signal.SIGUSR1):
    """In a rank process: on ``signum`` write every thread's Python stack to ``path``.

    faulthandler writes from the C signal handler, so it works even when the
    main thread is blocked inside a collective. Returns the open file (keep it).
    """
    f = open(path, "a", buffering=1)
    faulthandler.register(signum, file=f, all_threads=True, chain=False)
    return f


def signal_stack_dumper(pids: dict[int, int], paths: dict[int, Path], wait_s: float = 2.0,
                        signum: int = signal.SIGUSR1) -> Callable[[int], str | None]:
    """A ``dump_stacks`` for :class:`Watchdog`: signal the rank's process, return its stacks.

    The rank must have called :func:`install_stack_dump` with ``paths[rank]``.
    Returns None if the process is gone or wrote nothing within ``wait_s``.
    """
    def dump(rank: int) -> str | None:
        path = Path(paths[rank])
        size0 = path.stat().st_size if path.exists() else 0
        try:
            os.kill(pids[rank], signum)
        except ProcessLookupError:
            return None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:  # the dump is written by another process
            if path.exists() and path.stat().st_size > size0:
                time.sleep(0.05)  # let faulthandler finish every thread
                return f"{path}:\n" + path.read_text()[size0:]
            time.sleep(0.02)
        return None

    return dump
