"""Starting a campaign's own Ray cluster, again when Ray's start-up timed out under load.

A local ``ray.init`` starts the GCS, then a raylet that waits for its dashboard agent (a Python
process with a heavy import) to write its port files. On a loaded host the agent can take longer
than the raylet waits: the raylet exits with "Timed out waiting for file .../metrics_agent_port_..."
in its ``raylet.err``, and ``ray.init`` raises only "The current node timed out during startup"
(ray-project/ray#65983, open; both waits are hard-coded in Ray 2.60, neither is a setting
``ray.init`` takes). Seen here with a full test suite and one more campaign on 2 cores (docs/testing.md,
"Flakes"). Nothing of the campaign has started then, so the start is tried again (tenacity), after
the half-started node's processes are killed; every retry is a ``ray.start_retry`` telemetry event.
When the last attempt times out too, what is left of its node is killed and the start fails with one
line (``ControlPlaneTimeout``: the problem, the host's load, the fix), not Ray's traceback. Any other
error of ``ray.init`` is raised at once.
"""
from __future__ import annotations

import os
import time
from typing import Callable

import psutil
import tenacity

from t1ops import telemetry
from t1ops.errors import ControlPlaneTimeout

ATTEMPTS = 3
STARTUP_TIMEOUT = "timed out during startup"   # ray/_private/node.py, Ray 2.60


def is_startup_timeout(err: BaseException) -> bool:
    return STARTUP_TIMEOUT in str(err)


def kill_ray_children(since: float) -> int:
    """Kill this process's Ray children started at or after ``since`` (what is left of the
    half-started node: GCS, dashboard, monitors); how many. Other children (an engine a caller
    started) are left. The agents were the dead raylet's children: they exit when they see it gone."""
    killed = 0
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if p.create_time() >= since - 1 and ("/ray/" in cmd or cmd.startswith("ray::")):
                p.kill()
                killed += 1
        except psutil.Error:
            continue
    return killed


def gave_up(attempts: int, err: BaseException) -> ControlPlaneTimeout:
    """The one-line error of a start that timed out ``attempts`` times: what happened, why, the fix."""
    load = os.getloadavg()[0]
    return ControlPlaneTimeout(
        f"Ray's local node timed out during startup {attempts} time(s) in a row (its dashboard agent did not "
        f"start within the raylet's hard-coded wait: the host is overloaded, load average {load:.0f} on "
        f"{os.cpu_count()} CPUs; ray-project/ray#65983): run again when the host is less busy, or start a "
        "cluster once yourself (`ray start --head`, again if it times out) and point run.ray_address at it "
        "(docs/testing.md, \"Flakes\")", attempts=attempts, load_average=round(load, 1),
        error=str(err).splitlines()[0][:200])


def start_with_retry(start: Callable[[], object], attempts: int | None = None) -> None:
    """``start()`` (a local ``ray.init``), up to ``attempts`` times while it fails with Ray's
    start-up timeout (default :data:`ATTEMPTS`); when the last one times out too, its node's
    processes are killed and :func:`gave_up`'s one-line error is raised. Any other error as it came."""
    attempts = attempts or ATTEMPTS
    began = time.time()  # when the attempt now failing started its processes

    def before_retry(state: tenacity.RetryCallState) -> None:
        nonlocal began
        killed = kill_ray_children(began)
        telemetry.event("ray.start_retry", severity="warn", attempt=state.attempt_number,
                        error=str(state.outcome.exception()).splitlines()[0][:200], killed=killed,
                        known_issue="ray-project/ray#65983")
        began = time.time()

    try:
        for attempt in tenacity.Retrying(stop=tenacity.stop_after_attempt(attempts),
                                         retry=tenacity.retry_if_exception(is_startup_timeout),
                                         wait=tenacity.wait_fixed(1.0), before_sleep=before_retry, reraise=True):
            with attempt:
                start()
    except Exception as err:
        if not is_startup_timeout(err):
            raise
        kill_ray_children(began)
        raise gave_up(attempts, err) from err
