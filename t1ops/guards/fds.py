"""File-descriptor guard: raise the soft nofile limit, watch fd usage, name stalls.

Report, section 09: "Collected 0/16, completed=0" sat forever with no
exception: 320 concurrent trials pushed the coordinator's raylet past the
1024 soft-nofile wall and result deliveries were dropped silently. Three
defences, each usable alone:

- :func:`raise_nofile_limit` at start-up: the workers of the campaign's own Ray cluster inherit
  it from the raylet ``ray.init`` starts; on a cluster it did not start, :func:`worker_setup_hook`
  runs in every Ray worker (``ray.init(runtime_env=ray_runtime_env())``; docs/campaign.md);
- :class:`FdGuard` samples open fds of the coordinator and workers (psutil),
  warns at ``GuardsConfig.fd_warn_fraction`` and keeps a high-water mark;
- :class:`StallDetector`: work in flight and zero completions for longer than
  ``GuardsConfig.stall_timeout_s`` raises :class:`StallError` naming the causes
  it can check (fds near the limit, dead engines, lost deliveries).
"""
from __future__ import annotations

import errno
import os
import resource
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import psutil

from t1ops import telemetry
from t1ops.doctor import Check, check
from t1ops.errors import InputError, StallError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "fd-exhaustion": ("guards.fd_warn_fraction", "guards.fd_sample_interval_s", "guards.stall_timeout_s"),
}

RUNBOOK = "runbooks/fd-exhaustion.md"


def raise_nofile_limit(target: int | None = None) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to ``target`` (default: the hard limit).

    Never lowers the soft limit. Returns ``(old_soft, new_soft)``; emits the
    event ``fd.limit_raised`` when it changed anything.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if target is None else target
    if hard != resource.RLIM_INFINITY and want > hard:
        raise InputError(f"raise_nofile_limit(target={want}) exceeds the hard limit {hard}; "
                         "raise the hard limit (limits.conf / ulimit -Hn / container ulimits) or pass "
                         "target <= hard", target=want, hard=hard)
    if soft != resource.RLIM_INFINITY and (want == resource.RLIM_INFINITY or want > soft):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        telemetry.event("fd.limit_raised", old_soft=soft, new_soft=want, hard=hard)
        return soft, want
    return soft, soft


def worker_setup_hook() -> None:
    """Ray ``worker_process_setup_hook``: raise the soft nofile limit in each worker."""
    raise_nofile_limit()


def ray_runtime_env(base: dict | None = None) -> dict:
    """``base`` plus the worker set-up hook, for ``ray.init(runtime_env=...)``.

    The hook is given by import path so that every worker, on any node,
    imports it rather than unpickling a closure.
    """
    env = dict(base or {})
    existing = env.get("worker_process_setup_hook")
    hook = f"{worker_setup_hook.__module__}.{worker_setup_hook.__name__}"
    if existing not in (None, hook):
        raise InputError(f"runtime_env already has worker_process_setup_hook={existing!r}; call "
                         f"{hook} from inside it instead of replacing it", existing=str(existing))
    env["worker_process_setup_hook"] = hook
    return env


@dataclass(frozen=True)
class FdUsage:
    """Open fds of one process against its soft limit."""

    pid: int
    num_open: int
    soft_limit: int

    @property
    def fraction(self) -> float:
        return self.num_open / self.soft_limit if self.soft_limit > 0 else 0.0

    def describe(self) -> str:
        return f"pid {self.pid}: {self.num_open}/{self.soft_limit} fds ({self.fraction:.0%})"


def fd_usage(pid: int | None = None) -> FdUsage:
    """Open fds and soft nofile limit of ``pid`` (default: this process).

    Reading ``/proc`` needs an fd: when *this* process's table is full that
    fails with EMFILE, which is itself the answer, reported as this process
    at its soft limit (``num_open == soft_limit``).
    """
    try:
        proc = psutil.Process(pid)
        soft, _hard = proc.rlimit(psutil.RLIMIT_NOFILE)
        num_open = proc.num_fds()
    except OSError as err:
        if err.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return FdUsage(pid=os.getpid(), num_open=soft, soft_limit=soft)
    if soft == resource.RLIM_INFINITY:
        soft = 2 ** 31 - 1
    return FdUsage(pid=proc.pid, num_open=num_open, soft_limit=soft)


class FdGuard:
    """Sample fd usage of a set of processes; warn near the limit; remember the peak.

    ``pids`` returns the processes to watch (default: this one); a process
    that has exited is skipped. :meth:`start` raises this process's soft
    limit, and optionally samples every ``interval_s`` on a daemon thread.
    """

    def __init__(self, warn_fraction: float = 0.8, pids: Callable[[], Iterable[int]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < warn_fraction <= 1:
            raise InputError(f"FdGuard(warn_fraction={warn_fraction}) must be in (0, 1]",
                             warn_fraction=warn_fraction)
        self.warn_fraction = warn_fraction
        self._pids = pids or (lambda: [os.getpid()])
        self._clock = clock
        self.peak: FdUsage | None = None
        self.peak_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy_s = 0.0  # seconds spent sampling (the guard's own overhead, reported per step)

    def start(self, interval_s: float | None = None, raise_limit: bool = True) -> "FdGuard":
        """Raise the soft limit (unless told not to); sample periodically if ``interval_s``."""
        if raise_limit:
            raise_nofile_limit()
        if interval_s is not None:
            self._thread = threading.Thread(target=self._loop, args=(interval_s,), daemon=True,
                                            name="t1ops-fd-guard")
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.sample()

    def sample(self) -> list[FdUsage]:
        """One reading per live process; gauges ``fd.open``/``fd.fraction``, event ``fd.near_limit``."""
        t0 = time.perf_counter()
        try:
            return self._sample()
        finally:
            self.busy_s += time.perf_counter() - t0

    def _sample(self) -> list[FdUsage]:
        out: list[FdUsage] = []
        for pid in self._pids():
            try:
                u = fd_usage(pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            out.append(u)
            telemetry.gauge("fd.open", u.num_open, pid=u.pid)
            telemetry.gauge("fd.fraction", u.fraction, pid=u.pid)
            if self.peak is None or u.fraction >= self.peak.fraction:
                self.peak, self.peak_at = u, self._clock()
            if u.fraction >= self.warn_fraction:
                telemetry.event("fd.near_limit", "warn", pid=u.pid, num_open=u.num_open,
                                soft_limit=u.soft_limit, fraction=round(u.fraction, 3),
                                runbook=RUNBOOK)
        return out

    def near_limit(self) -> list[FdUsage]:
        """Fresh readings at or above the warn fraction, plus the peak if it was."""
        hot = [u for u in self.sample() if u.fraction >= self.warn_fraction]
        if self.peak is not None and self.peak.fraction >= self.warn_fraction and self.peak not in hot:
            hot.append(self.peak)
        return hot


@dataclass(frozen=True)
class StallStatus:
    """What :meth:`StallDetector.check` saw when it did not raise."""

    num_submitted: int
    num_completed: int
    num_in_flight: int
    idle_s: float


class StallDetector:
    """Turn "collected 0/16" forever into an error that names its likely cause.

    Call :meth:`on_submit` when work is launched, :meth:`on_complete` when a
    result *arrives at the collector* (never when a worker says it finished: a
    delivery lost on the way must stay in flight), :meth:`on_progress` when the
    workers report progress (it restarts the silence clock); call :meth:`check`
    from the collection loop. It raises
    :class:`StallError` when work is in flight and nothing has completed for
    ``threshold_s`` (counted from the last completion, or from when work went
    in flight after an idle period). Optional probes name causes:

    - ``fd_guard``: fd usage of the watched processes at or near the limit;
    - ``dead_engines``: returns the names of engines that are down;
    - ``num_sent``: results the workers say they sent (settable later with
      :meth:`set_num_sent`); every submitted item sent but some never received
      means deliveries were lost on the way;
    - ``busy``: lines naming what the in-flight work is inside now (the verifiers that run:
      ``t1ops.guards.watchdog.running_verifiers``), named first.
    """

    def __init__(self, threshold_s: float, clock: Callable[[], float] = time.monotonic, *,
                 fd_guard: FdGuard | None = None, dead_engines: Callable[[], list[str]] | None = None,
                 num_sent: Callable[[], int] | None = None, what: str = "results",
                 busy: Callable[[], list[str]] | None = None) -> None:
        if threshold_s <= 0:
            raise InputError(f"StallDetector(threshold_s={threshold_s}) must be > 0", threshold_s=threshold_s)
        self.threshold_s = threshold_s
        self._clock = clock
        self._fd_guard, self._dead_engines, self._num_sent = fd_guard, dead_engines, num_sent
        self._busy = busy  # what the in-flight work is doing now (running verifiers: slow-verifier)
        self.what = what
        self.num_submitted = 0
        self.num_completed = 0
        self._last_progress = clock()

    @property
    def num_in_flight(self) -> int:
        return self.num_submitted - self.num_completed

    def on_submit(self, n: int = 1) -> None:
        if self.num_in_flight == 0:  # the clock starts when work goes in flight
            self._last_progress = self._clock()
        self.num_submitted += n

    def set_num_sent(self, num_sent: Callable[[], int]) -> None:
        """The probe of results the workers say they sent (the collector is built after the guard)."""
        self._num_sent = num_sent

    def on_progress(self) -> None:
        """Workers made progress (a trial finished there): the silence clock restarts."""
        self._last_progress = self._clock()

    def on_complete(self, n: int = 1) -> None:
        if n > self.num_in_flight:
            raise InputError(f"on_complete(n={n}) but only {self.num_in_flight} {self.what} are in flight; "
                             "call on_submit for every launched item", n=n, num_in_flight=self.num_in_flight)
        self.num_completed += n
        self._last_progress = self._clock()

    def check(self) -> StallStatus:
        """Raise :class:`StallError` on a stall, else return the current counts."""
        idle_s = self._clock() - self._last_progress
        status = StallStatus(self.num_submitted, self.num_completed, self.num_in_flight, idle_s)
        telemetry.gauge("stall.idle_s", idle_s)
        if self.num_in_flight == 0 or idle_s < self.threshold_s:
            return status
        causes = self.causes()
        msg = (f"stalled: collected {self.num_completed}/{self.num_submitted} {self.what}, "
               f"{self.num_in_flight} in flight, no completion for {idle_s:.1f} s "
               f"(threshold {self.threshold_s:g} s). Likely causes: " + "; ".join(causes)
               + f". See {RUNBOOK}.")
        telemetry.event("stall.detected", "error", idle_s=round(idle_s, 3), num_in_flight=self.num_in_flight,
                        num_completed=self.num_completed, causes=" | ".join(causes))
        raise StallError(msg, idle_s=idle_s, num_in_flight=self.num_in_flight,
                         num_completed=self.num_completed, num_submitted=self.num_submitted, causes=causes)

    def causes(self) -> list[str]:
        """Human-readable causes the probes can confirm; a fallback line if none."""
        found: list[str] = list(self._busy()) if self._busy is not None else []
        if self._fd_guard is not None:
            hot = self._fd_guard.near_limit()
            if hot:
                found.append("fd usage near the soft nofile limit (" + ", ".join(u.describe() for u in hot)
                             + "): deliveries fail with EMFILE and are dropped; raise the soft limit to the "
                             "hard limit (t1ops.guards.fds.raise_nofile_limit) or lower concurrency")
        if self._dead_engines is not None:
            dead = list(self._dead_engines())
            if dead:
                found.append(f"dead engines: {', '.join(dead)} (requests to them never return)")
        if self._num_sent is not None:
            sent = self._num_sent()
            if sent >= self.num_submitted > self.num_completed:
                found.append(f"lost deliveries: workers sent all {sent} {self.what}, {self.num_completed} "
                             f"arrived ({self.num_in_flight} lost between worker and collector)")
        if not found:
            checked = [n for n, p in (("fds", self._fd_guard), ("engines", self._dead_engines),
                                      ("deliveries", self._num_sent), ("verifiers", self._busy)) if p is not None]
            found.append("none of the checked causes (" + (", ".join(checked) or "no probes given")
                         + ") is present: the in-flight work itself is slow or hung; inspect the oldest trial")
        return found


@check
def fd_usage_check() -> Check:
    """Open fds of this process against its soft and hard limits."""
    u = fd_usage()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    detail = f"{u.describe()}; hard={hard}; t1ops raises soft to hard at start-up and in Ray workers"
    return Check("fd_usage", "warn" if u.fraction >= 0.8 else "ok", detail)
