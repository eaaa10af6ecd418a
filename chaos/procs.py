"""Small process helpers the scenarios share."""
from __future__ import annotations

import time

import psutil


def wait_stopped(pid: int, limit_s: float = 10.0) -> bool:
    """True once ``pid`` is in the stopped state. SIGSTOP is delivered asynchronously: on a loaded
    machine /proc can still say 'running' right after ``kill()`` returns, so observe the stop
    rather than read the state once."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            return True
        time.sleep(0.01)
    return False
