"""fd guard: limit raising, sampling, and the stall detector (fake clock, no sleeps)."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from t1ops import telemetry
from t1ops.errors import InputError, StallError
from t1ops.guards import fds


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _child(code: str, soft: int) -> dict:
    """Run ``code`` in a child whose soft nofile limit is ``soft``; it prints JSON."""
    def lower() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         preexec_fn=lower, cwd=os.getcwd())
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_raise_nofile_limit_raises_soft_to_hard_in_a_child():
    out = _child("import json, resource; from t1ops.guards.fds import raise_nofile_limit;"
                 "old, new = raise_nofile_limit();"
                 "print(json.dumps([old, new, *resource.getrlimit(resource.RLIMIT_NOFILE)]))", soft=64)
    old, new, soft, hard = out
    assert old == 64 and new == hard and soft == hard


def test_raise_nofile_limit_refuses_target_above_hard():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("hard limit is unlimited here")
    with pytest.raises(InputError, match="hard limit"):
        fds.raise_nofile_limit(hard + 1)


def test_raise_never_lowers():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert fds.raise_nofile_limit(min(soft, 16)) == (soft, soft)


def test_ray_runtime_env_adds_importable_hook_and_refuses_to_replace_another():
    env = fds.ray_runtime_env({"env_vars": {"A": "1"}})
    assert env["env_vars"] == {"A": "1"}
    module, _, name = env["worker_process_setup_hook"].rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is fds.worker_setup_hook
    with pytest.raises(InputError, match="worker_process_setup_hook"):
        fds.ray_runtime_env({"worker_process_setup_hook": "other.hook"})


def test_fd_guard_warns_and_keeps_peak():
    guard = fds.FdGuard(warn_fraction=0.8)
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(5)]
    try:
        before = fds.fd_usage()
        guard.warn_fraction = max(0.0001, before.num_open / before.soft_limit * 0.99)
        (u,) = guard.sample()
        assert u.num_open == before.num_open
        assert guard.peak == u
        assert telemetry.recent_events("fd.near_limit")[-1]["pid"] == os.getpid()
    finally:
        for fd in held:
            os.close(fd)
    guard.sample()
    assert guard.peak.num_open == before.num_open  # the peak survives the fds being closed


def test_fd_guard_rejects_bad_fraction():
    with pytest.raises(InputError, match="warn_fraction"):
        fds.FdGuard(warn_fraction=1.5)


def test_stall_detector_quiet_while_completing_and_when_idle():
    clock = FakeClock()
    det = fds.StallDetector(10.0, clock)
    clock.t += 100  # nothing in flight: never a stall
    assert det.check().num_in_flight == 0
    det.on_submit(4)
    clock.t += 9
    det.on_complete()
    clock.t += 9
    st = det.check()
    assert (st.num_completed, st.num_in_flight) == (1, 3) and st.idle_s == pytest.approx(9)


def test_stall_detector_starts_clock_when_work_goes_in_flight():
    clock = FakeClock()
    det = fds.StallDetector(10.0, clock)
    clock.t += 1000
    det.on_submit(2)
    clock.t += 5
    assert det.check().idle_s == pytest.approx(5)


def test_stall_names_every_checkable_cause():
    clock = FakeClock()
    guard = fds.FdGuard(warn_fraction=0.0001)  # this process is "near" any limit
    det = fds.StallDetector(10.0, clock, fd_guard=guard, dead_engines=lambda: ["engine-1"],
                            num_sent=lambda: 16)
    det.on_submit(16)
    clock.t += 10.5
    with pytest.raises(StallError) as err:
        det.check()
    text = str(err.value)
    assert "collected 0/16" in text and "no completion for 10.5 s" in text
    assert "fd usage near the soft nofile limit" in text
    assert "dead engines: engine-1" in text
    assert "lost deliveries: workers sent all 16 results, 0 arrived" in text
    assert err.value.context["num_in_flight"] == 16
    assert telemetry.recent_events("stall.detected")[-1]["severity"] == "error"


def test_stall_without_a_checkable_cause_says_so():
    clock = FakeClock()
    det = fds.StallDetector(1.0, clock, dead_engines=lambda: [], num_sent=lambda: 0)
    det.on_submit()
    clock.t += 2
    with pytest.raises(StallError, match=r"none of the checked causes \(engines, deliveries\)"):
        det.check()


def test_stall_detector_rejects_bad_input():
    with pytest.raises(InputError, match="threshold_s"):
        fds.StallDetector(0)
    det = fds.StallDetector(1.0, FakeClock())
    with pytest.raises(InputError, match="in flight"):
        det.on_complete()


def test_doctor_shows_fd_usage():
    c = fds.fd_usage_check()
    assert c.name == "fd_usage" and "hard=" in c.detail and f"pid {os.getpid()}" in c.detail


def test_fd_usage_reports_a_full_table_as_at_the_limit():
    out = _child("import json, os\nfrom t1ops.guards.fds import fd_usage\nheld = []\n"
                 "while True:\n    try:\n        held.append(os.open(os.devnull, os.O_RDONLY))\n"
                 "    except OSError:\n        break\n"
                 "u = fd_usage()\nprint(json.dumps([u.num_open, u.soft_limit]))", soft=32)
    assert out == [32, 32]



def test_a_result_lost_after_the_worker_sent_it_stays_in_flight_and_is_named():
    # The collector counts arrivals; the workers' progress only restarts the silence clock. Four
    # trials finish at the worker (progress), two results arrive, two are lost on the way.
    clock, sent = FakeClock(), [0]
    det = fds.StallDetector(10.0, clock)
    det.set_num_sent(lambda: sent[0])
    det.on_submit(4)
    for _ in range(4):
        clock.t += 3
        sent[0] += 1
        det.on_progress()
    det.on_complete(2)
    clock.t += 9
    assert det.check().num_in_flight == 2  # inside the threshold since the last progress
    clock.t += 2
    with pytest.raises(StallError, match=r"lost deliveries: workers sent all 4 results, 2 arrived \(2 lost"):
        det.check()


def test_still_running_work_is_not_called_a_lost_delivery():
    clock = FakeClock()
    det = fds.StallDetector(1.0, clock, num_sent=lambda: 3)
    det.on_submit(4)  # 3 sent, 1 still running and silent
    clock.t += 2
    with pytest.raises(StallError) as err:
        det.check()
    assert "lost deliveries" not in str(err.value)
