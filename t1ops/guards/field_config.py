"""Settings of the guards for failures reported from the field (issue #32): ``[guards.field]``; and
the run-health alarms' thresholds (issue #54): ``[guards.health]``.

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


class RunHealthConfig(Section):
    """``[guards.health]``: the run-health alarms' thresholds (t1ops/guards/run_health.py)."""

    enabled: bool = Field(True, description="Check every step row against the run-health alarms (health.* events, the step line, TensorBoard).")
    phase_stall_factor: float = Field(6.0, gt=1, description="health.phase-stalled: a phase (rollout, train, sync) slower than this many times its median over the run's earlier steps.")
    phase_min_steps: int = Field(3, ge=1, description="health.phase-stalled: no verdict before a phase has this many earlier steps (its median is noise before).")
    phase_stall_min_s: float = Field(10.0, ge=0, description="health.phase-stalled: and the phase this many seconds over its median (the tiny campaign's sub-second sync reached 5.4x its median from host load alone; docs/failures.md).")
    abort_share: float = Field(0.05, ge=0, le=1, description="health.aborts: failed (aborted) trials above this share of the step's expected trials.")
    no_spread_share: float = Field(0.6, gt=0, le=1, description="health.no-spread: at least this share of the last steps' groups have all rewards equal (no GRPO signal). miles' 0.5 sits 1 standard error above the healthy tiny campaign's 0.40 (docs/failures.md).")
    no_spread_min_groups: int = Field(32, ge=1, description="health.no-spread: the verdict pools the last steps' groups back until at least this many (8 groups of one tiny step swing 0.0-0.75).")
    truncated_share: float = Field(0.25, gt=0, le=1, description="health.truncated: at least this share of the step's trials ended truncated (max_new_tokens hit).")
    kv_cache_max: float = Field(0.9, gt=0, le=1, description="health.kv-cache: an engine's K/V cache peak (share of its slots) above this during the step (miles alarms at 90%).")
    ev_negative_steps: int = Field(3, ge=1, description="health.ev-negative: the critic's explained variance below ev_negative_below this many steps in a row.")
    ev_negative_below: float = Field(-0.05, le=0, description="health.ev-negative: the EV that counts as negative (a zero-initialised critic reads -0.016 to 0.011 on the healthy tiny campaign: noise around 0).")
    ev_negative_floor: float = Field(-1.0, le=0, description="health.ev-negative: an EV below this fires at once, without the streak (the critic's errors vary twice as much as the returns: that step's advantages are noise). A critic overshooting at a high learning rate read -31.9 and -4.79 for one step each, then saturated to a constant (EV 0), so no streak formed (docs/failures.md).")
    logprob_gap_max: float = Field(0.05, gt=0, description="health.logprob-gap: the train-rollout log-prob gap above this (the report's healthy band is ~0.01-0.02).")
    retokenized_rise: float = Field(0.05, gt=0, le=1, description="health.retokenized: the retokenized + split share of loss tokens risen by more than this over the first step's.")
    eval_shrink_share: float = Field(0.1, ge=0, le=1, description="health.eval-shrinking: an evaluation's trials with a verdict (failed ones kept as zeros have none) fewer than (1 - this) of the trials it planned.")
