"""Shared pytest fixtures."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return REPO


# Property tests are reproducible in the suite (the same examples every run, so a green main stays
# green); explore new inputs with `pytest --hypothesis-profile=explore` (random, more examples).
from hypothesis import settings as _hyp_settings  # noqa: E402

_hyp_settings.register_profile("repro", derandomize=True, print_blob=True)
_hyp_settings.register_profile("explore", derandomize=False, max_examples=1000, print_blob=True)
_hyp_settings.load_profile("repro")

# tests/fixtures/ holds task directories whose tests are run by the sandbox's verifier,
# never by this suite
collect_ignore_glob = ["fixtures/*"]


@pytest.fixture(autouse=True)
def _no_ray_left_running():
    """Fail the test that leaves Ray initialised: a cluster started by a stray thread dies with that
    thread and takes the whole pytest process down a minute later, tests away (docs/campaign.md)."""
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail("the test left Ray initialised (a campaign not shut down, or a Ray call after "
                    "ray.shutdown() that auto-started a cluster)")


@pytest.fixture(autouse=True)
def _fresh_event_ring():
    """Each test sees only the events it caused: the in-process ring outlives tests, and an earlier
    test's event would satisfy a later test's ``recent_events(...)[-1]`` check."""
    from t1ops import telemetry

    telemetry.forget_recent_events()
    yield
