"""Watching a multi-rank trainer: every rank's progress, every rank's stacks on a hang.

Rank side (each rank process):

- :class:`ProgressBeacon`: called after every micro-batch (``RankTrainer``'s
  ``on_micro_batch``), it rewrites ``<dir>/rank<r>.progress`` with the count;
- :func:`collective_watch`: a ``watch(name)`` factory for ``RankTrainer`` that
  wraps each of its collectives (micro-batch forwards with their TP/EP
  collectives, gradient all-reduces, gathers, the checkpoint save's gather, the weight sync's pieces) in
  :class:`t1ops.guards.dist.watch_collective` with the group's real timeout,
  so a long wait is reported as *slow, not dead* on the rank that waits;
- :func:`t1ops.guards.watchdog.install_stack_dump`: SIGUSR1 dumps its stacks.

Coordinator side: :class:`RankWatch` turns the beacons into
:meth:`Watchdog.report` calls (per rank) and checks the
:class:`~t1ops.guards.watchdog.Watchdog`; when one rank is hung it dumps the
stacks of EVERY rank (the silent one and the peers waiting for it inside the
collective) into the :class:`~t1ops.errors.HangError`. A warm-up (micro-batch
times decaying) is classified ``warming_up``, never hung (runbooks/jit-as-deadlock.md).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

from rl.atomic import publish_file
from t1ops.config import GuardsConfig
from t1ops.guards.dist import watch_collective
from t1ops.guards.watchdog import Watchdog, signal_stack_dumper


class ProgressBeacon:
    """Rank side: ``beacon(count)`` records that ``count`` micro-batches are done."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self(0)

    def __call__(self, count: int) -> None:
        # atomic, not durable: a liveness signal rewritten every micro-batch (rl.atomic)
        publish_file(self.path, f"{int(count)} {time.time():.3f}\n", durable=False)


def read_progress(path: str | Path) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def collective_watch(timeout: timedelta, guards: GuardsConfig) -> Callable[[str], contextlib.AbstractContextManager]:
    """``watch(name)`` for ``RankTrainer``: each collective reported slow after ``collective_slow_fraction``."""
    def watch(name: str):
        return watch_collective(name, timeout, slow_fraction=guards.collective_slow_fraction)

    return watch


@dataclass
class RankProcess:
    pid: int
    progress_path: Path
    stack_path: Path


class RankWatch:
    """Coordinator side: a :class:`Watchdog` over the trainer ranks, fed by their beacons."""

    def __init__(self, guards: GuardsConfig, ranks: dict[int, RankProcess], *, wait_s: float = 5.0,
                 watchdog: Watchdog | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.ranks = ranks
        self._dump_one = signal_stack_dumper({r: p.pid for r, p in ranks.items()},
                                             {r: p.stack_path for r, p in ranks.items()}, wait_s=wait_s)
        self.watchdog = watchdog or Watchdog.from_config(guards, ranks, clock=clock)
        self.watchdog._dump_stacks = self._dump_all
        self._seen = {r: read_progress(p.progress_path) or 0 for r, p in ranks.items()}
        self._seq = {r: 0 for r in ranks}
        self.dumped: str | None = None

    def _bump(self, rank: int) -> None:
        self._seq[rank] += 1
        self.watchdog.report(rank, self._seq[rank])

    def expect_work(self) -> None:
        """The ranks were handed work now: their silence is timed from here (idle time is no interval)."""
        for r in self.ranks:
            self.watchdog.restart_clock(r)
        self.dumped = None

    def poll(self) -> dict:
        """Read every beacon, report progress, classify; raises HangError (with all ranks' stacks)."""
        for r, p in self.ranks.items():
            count = read_progress(p.progress_path)
            if count is not None and count > self._seen[r]:
                self._seen[r] = count
                self._bump(r)
        return self.watchdog.check()

    def _dump_all(self, hung_rank: int) -> str:
        """Stacks of every rank: the silent one and its peers waiting inside the collective (once per hang)."""
        if self.dumped is not None:
            return self.dumped
        parts = []
        for r in sorted(self.ranks):
            stacks = self._dump_one(r)
            parts.append(f"--- rank {r} (pid {self.ranks[r].pid}) ---\n"
                         f"{stacks or 'no stacks (process gone or did not answer SIGUSR1)'}")
        self.dumped = "\n".join(parts)
        return self.dumped
