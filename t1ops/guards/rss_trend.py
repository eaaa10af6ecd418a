"""Host-RAM leak guard: per-role RSS trend, warned with the projected time to the limit.

slime issue #205 (github.com/THUDM/slime/issues/205): host RAM grew as training progressed
until the OS killed the job after about 12 hours; nothing warned, because every level check
(``t1ops.guards.hostmem.HostMemoryMonitor``: used fraction >= 90 %) is quiet until the last
stretch. A leak is a *slope*, visible from the first hour. So the campaign samples the RSS of
every role process (coordinator, rollout workers, engines, trainer ranks) each step and, per
process, over the last ``guards.field.rss_window_s``:

- fits a robust slope: Theil-Sen (the median of the pairwise slopes), so a one-time jump
  (a model load, a cache filled once) does not read as a trend;
- calls it a leak only when it is steady (at least :data:`MIN_AGREEMENT` of the sample pairs
  rise, and the rise over the window is :data:`MIN_RISE_OVER_NOISE` times the median deviation
  from the fitted line), the samples span ``rss_min_window_s`` and number ``rss_min_samples`` (noise does not
  warn), and the slope is at least ``rss_min_slope_mib_per_h``;
- projects the time until the process has eaten the memory still available (host or cgroup,
  the smaller: :class:`~t1ops.guards.hostmem.MemorySnapshot`) and warns (event
  ``host.mem.leak``, once per process) when that is under ``rss_warn_horizon_h``, naming the
  role, pid, slope in MiB/h and the projected time.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping

import psutil

from t1ops import telemetry
from t1ops.guards.field_config import FieldGuardsConfig

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "host-ram-leak": ("guards.field.rss_window_s", "guards.field.rss_min_window_s", "guards.field.rss_min_samples",
                      "guards.field.rss_min_slope_mib_per_h", "guards.field.rss_warn_horizon_h"),
}

RUNBOOK = "runbooks/host-ram-leak.md"
MIB = 2 ** 20
#: A trend is steady when at least this share of the (earlier, later) sample pairs rise ...
MIN_AGREEMENT = 0.9   # 0.8 let i.i.d. noise warn once in 24 soak runs (a real leak rises in ~all pairs)
#: ... and its rise over the window is at least this many times the typical (median absolute)
#: deviation from the fitted line: noise that happens to line up for a few samples is no leak.
MIN_RISE_OVER_NOISE = 3.0


def theil_sen(ts: list[float], ys: list[float]) -> tuple[float, float]:
    """(median pairwise slope, share of rising pairs) of the series; (0, 0) under two points."""
    slopes, rising = [], 0
    for i in range(len(ts)):
        for j in range(i + 1, len(ts)):
            if ts[j] > ts[i]:
                slopes.append((ys[j] - ys[i]) / (ts[j] - ts[i]))
                rising += ys[j] > ys[i]
    return (statistics.median(slopes), rising / len(slopes)) if slopes else (0.0, 0.0)


def _duration(hours: float) -> str:
    return f"{hours:.2f} h" if hours >= 1 else f"{hours * 60:.1f} min" if hours * 60 >= 1 else f"{hours * 3600:.1f} s"


@dataclass(frozen=True)
class LeakWarning:
    role: str
    pid: int
    slope_mib_per_h: float
    rss_bytes: int
    headroom_bytes: int
    hours_to_limit: float
    window_s: float
    num_samples: int

    def message(self) -> str:
        return (f"{self.role} (pid {self.pid}) leaks host RAM: RSS {self.rss_bytes / MIB:.0f} MiB rising "
                f"{self.slope_mib_per_h:.0f} MiB/h (steady over {self.num_samples} samples in {self.window_s:.0f} s); "
                f"at this rate the {self.headroom_bytes / MIB:.0f} MiB still available are gone in "
                f"{_duration(self.hours_to_limit)} and the OS OOM killer takes a process. Find what this role "
                f"retains per step (caches, lists of results, pinned buffers); restart it before then. See {RUNBOOK}.")


class RssTrend:
    """RSS samples per (role, pid); :meth:`check` names the steady climbers. The clock is injectable."""

    def __init__(self, field: FieldGuardsConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.f = field or FieldGuardsConfig()
        self._clock = clock
        self._series: dict[tuple[str, int], deque[tuple[float, int]]] = {}
        self.warned: dict[tuple[str, int], LeakWarning] = {}

    def add(self, role: str, pid: int, rss_bytes: int, t: float | None = None) -> None:
        t = self._clock() if t is None else t
        s = self._series.setdefault((role, pid), deque())
        s.append((t, rss_bytes))
        while s and s[0][0] < t - self.f.rss_window_s:
            s.popleft()

    def trend(self, role: str, pid: int, headroom_bytes: int) -> LeakWarning | None:
        """The leak verdict of one process now, or None (too few samples, too short, flat, noisy)."""
        s = self._series.get((role, pid)) or ()
        if len(s) < self.f.rss_min_samples or s[-1][0] - s[0][0] < self.f.rss_min_window_s:
            return None
        ts, ys = [t for t, _ in s], [y for _, y in s]
        slope, agreement = theil_sen(ts, ys)
        per_h = slope * 3600 / MIB
        if agreement < MIN_AGREEMENT or per_h < self.f.rss_min_slope_mib_per_h:
            return None
        intercept = statistics.median(y - slope * t for t, y in s)
        noise = statistics.median(abs(y - intercept - slope * t) for t, y in s)
        if slope * (ts[-1] - ts[0]) < MIN_RISE_OVER_NOISE * noise:
            return None
        hours = max(headroom_bytes, 0) / (slope * 3600)
        if hours >= self.f.rss_warn_horizon_h:
            return None
        return LeakWarning(role, pid, per_h, ys[-1], headroom_bytes, hours, ts[-1] - ts[0], len(s))

    def check(self, headroom_bytes: int) -> list[LeakWarning]:
        """Every process that leaks now; event ``host.mem.leak`` (warn) the first time each one does."""
        out = []
        for role, pid in list(self._series):
            w = self.trend(role, pid, headroom_bytes)
            if w is None:
                continue
            out.append(w)
            if (role, pid) not in self.warned:
                self.warned[(role, pid)] = w
                telemetry.event("host.mem.leak", "warn", role=role, pid=pid, slope_mib_per_h=round(w.slope_mib_per_h, 1),
                                hours_to_limit=round(w.hours_to_limit, 3), rss_bytes=w.rss_bytes,
                                message=w.message(), runbook=RUNBOOK)
        return out

    def sample(self, roles: Mapping[str, int], headroom_bytes: int) -> list[LeakWarning]:
        """Read each role's RSS now (a process that is gone is skipped) and :meth:`check`."""
        t = self._clock()
        for role, pid in roles.items():
            try:
                self.add(role, pid, psutil.Process(pid).memory_info().rss, t)
            except psutil.Error:
                continue
        return self.check(headroom_bytes)
