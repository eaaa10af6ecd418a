"""A Ray call after the campaign's shutdown raises; it never starts a cluster of its own
(docs/campaign.md, "Ray's lifetime")."""
from __future__ import annotations

import threading

import pytest

import t1ops  # noqa: F401  (sets RAY_ENABLE_AUTO_CONNECT=0 before Ray is used)


def test_a_late_ray_call_from_a_thread_raises_instead_of_starting_ray():
    import ray

    assert not ray.is_initialized()
    errors: list[BaseException] = []

    def late_guard_thread() -> None:
        try:
            ray.get([], timeout=1)
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            errors.append(err)

    t = threading.Thread(target=late_guard_thread)
    t.start()
    t.join()
    assert not ray.is_initialized(), "auto-connect started a cluster that dies with its thread"
    assert errors and "not been started" in str(errors[0])


