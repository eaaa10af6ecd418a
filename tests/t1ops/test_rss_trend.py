"""The host-RAM leak guard (t1ops.guards.rss_trend): a steady slope warns with its projection;
noise, a one-time jump and a short history do not."""
from __future__ import annotations

import mmap
import os
import random

import pytest

from t1ops.config import GuardsConfig
from t1ops.guards.rss_trend import MIB, RssTrend, theil_sen

HOUR = 3600.0


def _trend(series, headroom_mib=4096, **field):
    f = GuardsConfig().field
    for k, v in field.items():
        setattr(f, k, v)
    tr = RssTrend(f)
    for t, mib in series:
        tr.add("worker-0", 4242, int(mib * MIB), t)
    return tr.trend("worker-0", 4242, int(headroom_mib * MIB))


def test_a_steady_leak_warns_with_slope_and_time_to_the_limit():
    # slime issue #205's shape: +200 MiB/h, 4 GiB left -> about 20 h, sampled every 2 min for an hour
    w = _trend([(t, 1000 + 200 * t / HOUR + random.Random(t).uniform(-5, 5)) for t in range(0, 3601, 120)])
    assert w is not None and w.role == "worker-0" and w.pid == 4242
    assert w.slope_mib_per_h == pytest.approx(200, rel=0.1)
    assert w.hours_to_limit == pytest.approx(4096 / 200, rel=0.1)
    msg = w.message()
    assert "worker-0 (pid 4242)" in msg and f"{w.slope_mib_per_h:.0f} MiB/h" in msg and f"gone in {w.hours_to_limit:.2f} h" in msg


def test_noise_a_one_time_jump_and_a_short_history_do_not_warn():
    rng = random.Random(0)
    noise = [(t, 1000 + rng.uniform(-300, 300)) for t in range(0, 3601, 120)]
    assert _trend(noise) is None                                   # no steady direction
    jump = [(t, 1000 if t < 600 else 3000) for t in range(0, 3601, 120)]
    assert _trend(jump) is None                                    # a model load, not a leak
    leak = [(t, 1000 + 200 * t / HOUR) for t in range(0, 3601, 120)]
    assert _trend(leak[:4]) is None                                # fewer than rss_min_samples
    assert _trend([(t / 10, m) for t, m in leak]) is None          # 6 min < rss_min_window_s (10 min)
    assert _trend(leak, headroom_mib=10 * 1024 * 1024) is None     # 10 TiB left: beyond the horizon
    assert _trend([(t, 1000 + 20 * t / HOUR) for t, _ in leak]) is None  # 20 MiB/h < the floor


def test_theil_sen_ignores_an_outlier():
    slope, agree = theil_sen([0, 1, 2, 3, 4, 5], [0, 1, 2, 100, 4, 5])
    assert slope == pytest.approx(1.0) and agree > 0.6


def test_sample_reads_real_processes_and_warns_once():
    f = GuardsConfig().field
    f.rss_min_window_s, f.rss_min_samples, f.rss_min_slope_mib_per_h = 1.0, 3, 1.0
    clock = [0.0]
    tr = RssTrend(f, clock=lambda: clock[0])
    keep, warnings = [], []
    for i in range(8):   # this process really grows by 8 MiB per "step"
        # fresh anonymous pages, each touched: a bytearray could reuse heap memory a test before this one
        # freed (glibc raises its mmap threshold after big frees), and then RSS would not grow at all
        page = mmap.mmap(-1, 8 * MIB)
        for off in range(0, 8 * MIB, mmap.PAGESIZE):
            page[off] = 1
        keep.append(page)
        clock[0] = float(i)
        # every sample: when the trend first qualifies depends on what else this process frees meanwhile;
        # the event (tr.warned) comes once
        warnings += tr.sample({"coordinator": os.getpid(), "gone": 2 ** 22 + 7}, 64 * 1024 * MIB)
    assert {w.role for w in warnings} == {"coordinator"} and list(tr.warned) == [("coordinator", os.getpid())]
    assert warnings[0].slope_mib_per_h == pytest.approx(8 * 3600, rel=0.25)


def test_the_campaign_guards_feed_every_role_each_step(tmp_path):
    from t1ops.campaign.guarding import CampaignGuards
    from t1ops.config import CampaignConfig

    g = CampaignGuards(CampaignConfig(), tmp_path, dead_engines=lambda: [],
                       roles=lambda: {"coordinator": os.getpid(), "worker-0": os.getppid()})
    try:
        g.trainer_pid = os.getpid()
        for step in (1, 2, 3):
            g.after_step(step)
    finally:
        g.fd_guard.stop()
    assert set(g.role_pids()) == {"coordinator", "worker-0", "trainer"}
    assert {role: len(s) for (role, _), s in g.rss_trend._series.items()} == {"coordinator": 3, "worker-0": 3,
                                                                              "trainer": 3}
