"""Shared set-up of the container-backend tests: the runtime (skip, printing why, where it
cannot be installed) and the stand-in base images (seeded once per host, then cached)."""
from __future__ import annotations

import functools
import os

import pytest

from rl.agent.container import runtime

NAMES = ("python:3.11-slim", "python:3.12-slim", "gcc:13.3.0-bookworm", "ubuntu:24.04")


@functools.lru_cache(maxsize=1)
def _ready() -> str:
    """'' when the runtime and the stand-ins are usable, else why not."""
    if os.geteuid() != 0:
        return "the container backend runs rootful podman: not root"
    ok, why = runtime.available()
    if not ok:
        return why
    from rl.agent.container.images import exists
    from rl.agent.container.seed import seed

    try:
        if not all(exists(n) for n in NAMES):
            seed(list(NAMES), log=lambda *a: None)
    except Exception as e:   # no Debian mirror reachable: nothing to build images from
        return f"cannot seed stand-in base images ({type(e).__name__}: {str(e)[:200]})"
    return ""


def require_container_runtime() -> None:
    why = _ready()
    if why:
        print(f"container backend tests skipped: {why}")
        pytest.skip(f"container runtime unavailable: {why}")
