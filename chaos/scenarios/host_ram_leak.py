"""host-ram-leak: host RAM grows step by step until the OS OOM killer ends the run.

slime issue #205 (github.com/THUDM/slime/issues/205): host memory rose as training
progressed and the job was OOM-killed after about 12 hours, with no warning before. Fault
(real): a rollout-worker process that retains what it allocates each step (2 MiB every
0.1 s step, written so it is resident) runs in a memory cgroup this scenario creates
(the host-oom-kill scenario's, limit 160 MiB: the kernel's OOM killer ends it, or a
user-space killer at the same cap where no cgroup can be made); beside it a "coordinator"
process allocates and frees at random (noise, no leak). Both are sampled every 0.25 s. Time
is scaled: the run lasts seconds where slime's lasted 12 hours; the trend settings too
(``guards.field.rss_min_window_s`` 600 s -> 1.5 s, ``rss_window_s`` 3600 s -> 60 s).

Unguarded: the level check (``HostMemoryMonitor``: used >= 90 % of the limit) is silent until
the last stretch; the first clear signal is the kill (exit -9). Guarded
(``t1ops.guards.rss_trend.RssTrend``, fed each step in ``CampaignGuards.after_step``): a
warning in the first half of the run naming the role, pid, slope in MiB/h and the projected
time to the limit, which matches the real time left; the noisy process never warns.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from chaos.harness import Guarded, Outcome, Timeline, register

LIMIT_BYTES = 160 * 2 ** 20
SAMPLE_S = 0.25
LEAKER = ("import time\nkeep = []\nwhile True:  # one step: what it allocates is retained (the leak)\n"
          "    keep.append(b'\\x01' * (2 * 2 ** 20))\n    time.sleep(0.1)\n")
NOISE = ("import random, sys, time\nfirst = True\nwhile True:  # allocates and frees: RSS up and down, no trend\n"
         "    x = bytearray(random.randint(0, 24 * 2 ** 20))\n    x[::4096] = b'\\x01' * len(x[::4096])\n"
         "    if first:\n        print('ready', flush=True)\n        first = False\n"
         "    time.sleep(0.1)\n    del x\n")
#: a freed block goes back to the OS at once (no glibc heap ratchet): the noise really goes down
NOISE_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def _field():
    from t1ops.config import GuardsConfig

    f = GuardsConfig().field
    f.rss_window_s, f.rss_min_window_s, f.rss_min_samples = 60.0, 1.5, 8
    return f


@register("host-ram-leak", "host RAM leaks step by step until the OOM killer ends the run")
def run(tmp: Path) -> Outcome:
    from chaos.scenarios.host_oom_kill import _Cgroup
    from t1ops.guards.hostmem import HostMemoryMonitor, read_cgroup_memory
    from t1ops.guards.rss_trend import RssTrend

    try:
        cgroup: _Cgroup | None = _Cgroup(LIMIT_BYTES)
        mechanism = f"kernel memcg OOM kill in own cgroup {cgroup.path}"
    except OSError as err:
        cgroup, mechanism = None, f"fallback: no cgroup v1 memory controller ({err}); user-space SIGKILL at the cap"
    trend, level = RssTrend(_field()), HostMemoryMonitor(0.9, cgroup_dir=cgroup.path if cgroup else None)
    noise = subprocess.Popen([sys.executable, "-c", NOISE], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, **NOISE_ENV})
    noise.stdout.readline()   # past its start-up: a start-up is a ramp, not the noise under test
    leak = subprocess.Popen([sys.executable, "-c", LEAKER], preexec_fn=cgroup.join if cgroup else None)
    t0, first_level, first_trend, peak = time.monotonic(), None, {}, 0
    try:
        while leak.poll() is None and time.monotonic() - t0 < 60:
            now = time.monotonic() - t0
            try:
                rss = psutil.Process(leak.pid).memory_info().rss
            except psutil.Error:
                break
            peak = max(peak, rss)
            if cgroup is not None:
                level.sample()
                cg = read_cgroup_memory(cgroup.path)
                used, headroom = cg.usage_bytes / LIMIT_BYTES, cg.available_bytes
            else:
                used, headroom = rss / LIMIT_BYTES, LIMIT_BYTES - rss
                if rss > LIMIT_BYTES:
                    leak.send_signal(signal.SIGKILL)
            if used >= 0.9 and first_level is None:
                first_level = now
            for w in trend.sample({"rollout-worker-0": leak.pid, "coordinator": noise.pid}, headroom):
                first_trend.setdefault(w.role, (now, w))
            time.sleep(SAMPLE_S)
        rc = leak.wait(timeout=30)
        killed_at = time.monotonic() - t0
    finally:
        for p in (noise, leak):
            if p.poll() is None:
                p.kill()
                p.wait()
        if cgroup is not None:
            cgroup.remove()
    warned_at, w = first_trend.get("rollout-worker-0", (None, None))
    projected_s = w.hours_to_limit * 3600 if w else None
    real_left = killed_at - warned_at if warned_at is not None else None
    tl = Timeline()  # from the leak's start; the trend names it, the OOM killer ends the worker later
    tl.fault(at=0.0)
    tl.after_fault(detected=warned_at, stopped=killed_at)
    return Outcome(
        fault_fired=rc in (-9, 137) and peak > LIMIT_BYTES / 2,
        unguarded=(f"rollout-worker-0 (pid {leak.pid}) killed (exit {rc}) at {killed_at:.1f} s; the level check "
                   + (f"first warned {killed_at - first_level:.1f} s before" if first_level is not None
                      else "never warned")),
        guarded=Guarded(caught=w is not None, detection_s=warned_at, error=w.message() if w else ""),
        invariants={
            "unguarded: the leaking worker was OOM-killed": rc in (-9, 137),
            "unguarded: the level check was silent until the last quarter of the run": first_level is None
            or killed_at - first_level < 0.25 * killed_at,
            "warned in the first half of the run, naming role, pid and slope": warned_at is not None
            and warned_at < 0.5 * killed_at and f"rollout-worker-0 (pid {leak.pid})" in w.message()
            and "MiB/h" in w.message(),
            "projected time to the limit within 2x of the real time left": projected_s is not None
            and 0.5 <= projected_s / real_left <= 2.0,
            "the noisy process never warned": "coordinator" not in first_trend,
        },
        details={"mechanism": mechanism, "killed_at_s": round(killed_at, 2), "level_warned_at_s": first_level,
                 "trend_warned_at_s": warned_at, "projected_s": projected_s, "real_left_s": real_left,
                 "peak_rss_mib": round(peak / 2 ** 20, 1),
                 "scale": "2 MiB per 0.1 s step into a 160 MiB cgroup; rss_min_window_s 1.5 s, rss_window_s 60 s"},
        recovery=tl.recovery(how=("a warning " + (f"{real_left:.1f} s" if real_left is not None else "-")
                                  + " before the OOM kill (stop): the lead time to restart the named worker "
                                  "(runbook); the restart itself is not measured")),
    )
