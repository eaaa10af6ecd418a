"""Explicit, configured timeouts for every process group t1ops creates.

Report, section 09: one run died when an actor rank stalled at the
weight-update barrier longer than Gloo's built-in 30-minute timeout; section
08: recreated NCCL groups default to 30 min, 120 min in CP > 1 recipes, and the
Gloo control group to 60 min. So:

- :func:`init_process_group` and :func:`new_group` wrap ``torch.distributed``
  and refuse (:class:`DistributedTimeoutError`) to create a group without an
  explicit ``timeout``; :func:`timeout_for` gives the configured one;
- :func:`apply_nccl_env` sets the NCCL watchdog/heartbeat variables the same
  way in every process and refuses a conflicting pre-set value;
- :class:`watch_collective` reports a long wait as *slow* (event
  ``dist.collective_slow``) before the timeout, so a slow rank is not read as a
  dead one;
- the doctor check ``dist_group_timeouts`` shows the effective values;
- the rendezvous of :func:`init_process_group` is bounded and retried on fresh ports
  (``t1ops.guards.rendezvous``, group-init-race): a rank that never arrives is named.
"""
from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable, MutableMapping

from t1ops import telemetry
from t1ops.config import GuardsConfig
from t1ops.doctor import Check, check
from t1ops.errors import ConfigError, DistributedTimeoutError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "gloo-default-timeout": ("guards.gloo_timeout_min", "guards.nccl_timeout_min", "guards.nccl_timeout_cp_min"),
    "group-init-race": ("guards.field.group_init_timeout_s", "guards.field.group_init_attempts"),
}

RUNBOOK = "runbooks/gloo-default-timeout.md"


def timeout_for(backend: str, guards: GuardsConfig, context_parallel: int = 1) -> timedelta:
    """The configured timeout of a ``backend`` group (NCCL: 120 min when CP > 1)."""
    if backend == "nccl":
        minutes = guards.nccl_timeout_cp_min if context_parallel > 1 else guards.nccl_timeout_min
    elif backend == "gloo":
        minutes = guards.gloo_timeout_min
    else:
        raise ConfigError(f"timeout_for(backend={backend!r}): t1ops configures 'nccl' and 'gloo' groups; "
                          "pick one of them", backend=backend)
    return timedelta(minutes=minutes)


def nccl_env(guards: GuardsConfig) -> dict[str, str]:
    """NCCL environment every process must share (set before the first NCCL group)."""
    return {
        # a timed-out collective aborts its communicator and raises, instead of hanging forever
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        # the heartbeat monitor watches the watchdog thread itself, not collectives
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(int(guards.nccl_heartbeat_timeout_s)),
        # flight-recorder dump on timeout: which collective, which ranks were missing
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }


def env_conflicts(guards: GuardsConfig, environ: MutableMapping[str, str] = os.environ) -> dict[str, tuple[str, str]]:
    """``{key: (found, wanted)}`` for NCCL variables pre-set to a different value."""
    return {k: (environ[k], v) for k, v in nccl_env(guards).items() if k in environ and environ[k] != v}


def apply_nccl_env(guards: GuardsConfig, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set :func:`nccl_env` in ``environ``; a conflicting pre-set value is a ConfigError."""
    bad = env_conflicts(guards, environ)
    if bad:
        lines = ", ".join(f"{k}={found} (config wants {want})" for k, (found, want) in bad.items())
        raise ConfigError(f"NCCL environment disagrees with the guards config: {lines}; unset these "
                          "variables or change guards.nccl_heartbeat_timeout_s, so every rank runs with "
                          "the same values", conflicts=bad)
    env = nccl_env(guards)
    environ.update(env)
    return env


def _require_timeout(timeout: Any, where: str) -> timedelta:
    if timeout is None:
        raise DistributedTimeoutError(
            f"{where} needs an explicit timeout: torch's built-in default (30 min for Gloo) killed a slow "
            "weight-update barrier in the report. Pass timeout=timeout_for(backend, cfg.guards, context_parallel)",
            where=where)
    if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
        raise DistributedTimeoutError(f"{where}(timeout={timeout!r}) must be a positive datetime.timedelta",
                                      where=where, timeout=str(timeout))
    return timeout


def init_process_group(backend: str, *, timeout: timedelta, guards: GuardsConfig | None = None,
                       init_method: str | None = None, rank: int | None = None, world_size: int | None = None,
                       **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` that refuses to run without ``timeout``.

    A ``tcp://`` or ``t1ops-rdzv://`` ``init_method`` (with ``rank`` and ``world_size``) goes through
    :func:`t1ops.guards.rendezvous.rendezvous`: every rank arrives within
    ``guards.field.group_init_timeout_s`` per attempt, a failed attempt moves to a fresh port, and
    the last failure names the ranks that never arrived (:class:`GroupInitError`). torch's own
    TCPStore client can block past ``timeout`` (a port taken between probe and bind)."""
    import torch.distributed as dist

    from t1ops.guards.rendezvous import rendezvous

    g = guards or GuardsConfig()
    t = _require_timeout(timeout, "init_process_group")
    if backend == "nccl":
        apply_nccl_env(g)
    if init_method is not None and rank is not None and world_size is not None \
            and init_method.split("://")[0] in ("tcp", "t1ops-rdzv"):
        store = rendezvous(init_method, rank, world_size, g.field)
        dist.init_process_group(backend=backend, timeout=t, store=store, rank=rank, world_size=world_size, **kwargs)
    else:
        dist.init_process_group(backend=backend, timeout=t, init_method=init_method, rank=rank if rank is not None
                                else -1, world_size=world_size if world_size is not None else -1, **kwargs)
    telemetry.event("dist.group_created", group="default", backend=backend, timeout_s=t.total_seconds())


def new_group(ranks: list[int] | None = None, *, timeout: timedelta, backend: str | None = None,
              guards: GuardsConfig | None = None, **kwargs: Any):
    """``torch.distributed.new_group`` that refuses to run without ``timeout``."""
    import torch.distributed as dist

    t = _require_timeout(timeout, "new_group")
    if backend == "nccl":
        apply_nccl_env(guards or GuardsConfig())
    group = dist.new_group(ranks=ranks, timeout=t, backend=backend, **kwargs)
    telemetry.event("dist.group_created", group=str(ranks), backend=str(backend), timeout_s=t.total_seconds())
    return group


class watch_collective:
    """Context manager around a collective: says "slow, not dead" before the timeout.

    After ``slow_fraction`` of ``timeout`` it emits ``dist.collective_slow``
    (warn) once; on exit it records ``dist.collective_s``. ``slow_at_s`` is the
    elapsed time at which the slow event fired (None if it did not).
    """

    def __init__(self, name: str, timeout: timedelta, slow_fraction: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.timeout_s, self._clock = name, _require_timeout(timeout, "watch_collective").total_seconds(), clock
        self.slow_after_s = slow_fraction * self.timeout_s
        self.slow_at_s: float | None = None
        self.elapsed_s: float | None = None
        self._timer: threading.Timer | None = None

    def __enter__(self) -> "watch_collective":
        self._t0 = self._clock()
        self._timer = threading.Timer(self.slow_after_s, self._slow)
        self._timer.daemon = True
        self._timer.start()
        return self

    def _slow(self) -> None:
        self.slow_at_s = self._clock() - self._t0
        telemetry.event("dist.collective_slow", "warn", collective=self.name, waited_s=round(self.slow_at_s, 3),
                        timeout_s=self.timeout_s, message=f"{self.name} has waited {self.slow_at_s:.1f} s of its "
                        f"{self.timeout_s:g} s timeout: a peer rank is slow, not dead", runbook=RUNBOOK)

    def __exit__(self, exc_type, exc, tb) -> None:
        self._timer.cancel()
        self.elapsed_s = self._clock() - self._t0
        telemetry.observe("dist.collective_s", self.elapsed_s, collective=self.name)
        if exc is not None:
            telemetry.event("dist.collective_failed", "error", collective=self.name, elapsed_s=round(self.elapsed_s, 3),
                            timeout_s=self.timeout_s, error=f"{type(exc).__name__}: {exc}"[:500])


@check
def dist_group_timeouts() -> Check:
    """Effective group timeouts (config defaults) and the NCCL environment."""
    g = GuardsConfig()
    env = nccl_env(g)
    detail = (f"nccl={timeout_for('nccl', g)} (CP>1: {timeout_for('nccl', g, 2)}), gloo control="
              f"{timeout_for('gloo', g)}; set in every process: "
              + ", ".join(f"{k}={v}" for k, v in env.items()))
    bad = env_conflicts(g)
    if bad:
        return Check("dist_group_timeouts", "warn", detail + "; CONFLICT in environment: "
                     + ", ".join(f"{k}={f} (wants {w})" for k, (f, w) in bad.items()))
    return Check("dist_group_timeouts", "ok", detail)
