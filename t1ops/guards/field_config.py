"""Settings of the guards for failures reported from the field (issue #32): ``[guards.field]``.

Kept beside the guards instead of growing ``t1ops/config.py``; imports nothing of t1ops but the
section base, so ``t1ops.config`` can hold it. Each key names the guard that reads it.
"""
from __future__ import annotations

from pydantic import Field

from t1ops.config_section import Section


class FieldGuardsConfig(Section):
    # slow-verifier (rl/agent/verifier.py, t1ops/guards/watchdog.py)
    verifier_timeout_cap_s: float | None = Field(600.0, gt=0, description="A task's verifier timeout is capped at this many seconds (None: the task's own value); a verifier past it is killed and its trial fails with verifier-timeout (no reward without a verdict).")
    # host-ram-leak (t1ops/guards/rss_trend.py)
    rss_window_s: float = Field(3600.0, gt=0, description="Least-squares RSS slope per role process over the samples of the last this many seconds.")
    rss_min_window_s: float = Field(600.0, gt=0, description="No leak verdict before a process has been sampled over at least this many seconds (noise does not warn).")
    rss_min_samples: int = Field(10, ge=3, description="No leak verdict from fewer samples than this.")
    rss_min_slope_mib_per_h: float = Field(64.0, gt=0, description="Slopes below this many MiB/h are noise, not a leak.")
    rss_warn_horizon_h: float = Field(24.0, gt=0, description="Warn when a role's projected time to the host/cgroup memory limit is under this many hours.")
    # group-init-race (t1ops/guards/dist.py)
    group_init_timeout_s: float = Field(300.0, gt=0, description="Bound of one process-group rendezvous attempt (all ranks arrive, or the attempt fails naming the missing ranks).")
    group_init_attempts: int = Field(3, ge=1, le=20, description="Rendezvous attempts, each on a fresh port, before the init fails naming the ranks that never arrived.")
