"""Fixtures shared by tests/rl: ``env_backend`` runs a test once per environment backend
(``local``, ``container``); the container run skips, printing why, where the runtime cannot
be installed (tests/rl/container_support.py; docs/containers.md)."""
from __future__ import annotations

import pytest


@pytest.fixture(params=["local", "container"])
def env_backend(request) -> str:
    """The backend name to pass as ``Sandbox(..., backend=env_backend)``."""
    if request.param == "container":
        from tests.rl.container_support import require_container_runtime

        require_container_runtime()
    return request.param
