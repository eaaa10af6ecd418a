"""Run-health alarms: a healthy-looking run that has stopped learning, named at the step it shows.

The guards elsewhere catch faults; these read each finished step row (``t1ops.campaign.runner``)
and say when the run is degrading (docs/failures.md, "Run-health alarms"). The first four are from the
set miles ships (a team reads them at a glance), the rest the T1 report's and the SkyRL
walkthrough's own signals:

======================  ======================================================================
id                      fires when (threshold: ``[guards.health]`` key)
======================  ======================================================================
health.phase-stalled    a phase (rollout, train, sync) took > ``phase_stall_factor`` x its median and
                        > ``phase_stall_min_s`` seconds more than it
health.aborts           failed trials > ``abort_share`` of the step's expected trials
health.no-spread        >= ``no_spread_share`` of the groups of the last steps (pooled back until at least
                        ``no_spread_min_groups`` groups) have no reward spread
health.truncated        >= ``truncated_share`` of the step's trials ended truncated
health.kv-cache         the fullest engine's K/V cache peak (share of its slots, since the weights the step
                        sampled with loaded; ``rl.engines.batching``) > ``kv_cache_max``
health.ev-negative      explained variance < ``ev_negative_below`` for ``ev_negative_steps`` steps in a row,
                        or < ``ev_negative_floor`` at one step
health.logprob-gap      the train-rollout log-prob gap > ``logprob_gap_max``
health.retokenized      the loss tokens' retokenized + split share rose by > ``retokenized_rise``
                        over the run's first step with trajectories
health.eval-shrinking   an evaluation's trials with a verdict fewer than (1 - ``eval_shrink_share``) of its
                        planned trials (a failed trial kept as a zero, ``rollout.failed_trials = "zero"``,
                        has no verdict)
======================  ======================================================================

Each alarm is a ``health.<name>`` warning event, a key of the row's ``health`` map (every value a
curve in TensorBoard: ``train/health/<name>``), and a word on the step line; ``t1ops explain
health.<name>`` says what it means and what to do.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from t1ops import telemetry
from t1ops.campaign.dataplane import loss_relations
from t1ops.guards.field_config import RunHealthConfig

PHASES = ("rollout_s", "train_s", "sync_s")


ALARMS = {  # id -> (what it means, what to do); `t1ops explain ID`
    "health.phase-stalled": ("a phase of the step (rollout, train or sync) took more than phase_stall_factor times its "
                             "median (and phase_stall_min_s more): a straggling engine, a slow verifier, a stuck weight push",
                             "the step row's *_s fields and `rollout split` name the phase; runbooks/long-tail-stall.md, "
                             "runbooks/slow-verifier.md"),
    "health.aborts": ("more than abort_share of the step's trials failed or were aborted: engines dying, sandboxes "
                      "failing, verifiers killed", "the trial ledger's failed trials name the errors; "
                      "runbooks/dead-engine.md, runbooks/infra-failure-as-zero.md"),
    "health.no-spread": ("at least no_spread_share of the last steps' groups (at least no_spread_min_groups of them) "
                         "have one reward for every sample: no GRPO signal; the tasks are all solved or all failed at "
                         "this policy",
                         "rebalance the task pool's difficulty or raise n_samples_per_prompt; zero-variance filtering "
                         "(fully_async.zero_variance_filter) only hides it"),
    "health.truncated": ("at least truncated_share of the step's trials hit max_new_tokens: the policy rambles, or the "
                         "budget is too small", "look at the truncated trials' last turns; raise "
                         "rollout.max_new_tokens or add rollout.truncated_reward_zero"),
    "health.kv-cache": ("an engine's K/V cache was more than kv_cache_max full during the step: new requests wait "
                        "for a slot (SGLang retracts or queues them), so rollout time grows with concurrency",
                        "lower rollout.max_concurrency, add engines (engine.num_engines) or cache (engine.kv_slots on "
                        "the embedded engine); the row's kv_cache_peak is the figure"),
    "health.ev-negative": ("the critic's explained variance has been below ev_negative_below (< 0) for "
                           "ev_negative_steps steps, or fell below ev_negative_floor at one step: it predicts returns "
                           "worse than their mean, and PPO's advantages are noise",
                           "raise trainer.critic_warmup_steps or the critic's learning rate; the T1 report warms the "
                           "critic first (section 04)"),
    "health.logprob-gap": ("the train-rollout log-prob gap left its band: trainer and sampler disagree (routing "
                           "drift, stale weights, a token mismatch)", "runbooks/routing-drift.md, "
                                                                      "runbooks/token-drift.md, runbooks/weight-sync-corruption.md"),
    "health.retokenized": ("the share of loss tokens that went through the retokenized or split TITO relations is "
                           "rising: the chat template and the engine's stream diverge more and more",
                           "`t1ops tito-debug` on a recent trial; runbooks/token-drift.md"),
    "health.eval-shrinking": ("an evaluation scored fewer trials than it planned, or scored failed ones as zeros "
                              "(rollout.failed_trials = 'zero'): its number is not comparable with "
                              "the previous ones", "the evaluation's failed trials name the errors; "
                                                   "runbooks/single-loop-lock.md"),
}


THRESHOLDS = {  # id -> the [guards.health] keys that govern it
    "health.phase-stalled": ("guards.health.phase_stall_factor", "guards.health.phase_min_steps",
                             "guards.health.phase_stall_min_s"),
    "health.aborts": ("guards.health.abort_share",),
    "health.no-spread": ("guards.health.no_spread_share", "guards.health.no_spread_min_groups"),
    "health.truncated": ("guards.health.truncated_share",),
    "health.kv-cache": ("guards.health.kv_cache_max",),
    "health.ev-negative": ("guards.health.ev_negative_steps", "guards.health.ev_negative_below",
                           "guards.health.ev_negative_floor"),
    "health.logprob-gap": ("guards.health.logprob_gap_max",),
    "health.retokenized": ("guards.health.retokenized_rise",),
    "health.eval-shrinking": ("guards.health.eval_shrink_share",),
}


@dataclass
class RunHealth:
    """Reads each step row (and its trials), keeps the history the alarms need, fires them."""

    cfg: RunHealthConfig
    phases: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    ev_streak: int = 0
    spread: list[tuple[int, int]] = field(default_factory=list)  # per step: (groups, groups without spread)
    retokenized_base: float | None = None

    def check(self, row: dict, results: list) -> dict:
        """The row's ``health`` map ({signal: value}) and ``health_alarms`` (fired ids), events emitted."""
        if not self.cfg.enabled:
            return {}
        values, fired = {}, []

        def alarm(key: str, value: float, over: bool, **why) -> None:
            values[key] = round(float(value), 4)
            name = f"health.{key.split('/')[0]}"  # phase-stalled/rollout: the alarm phase-stalled
            if over:
                fired.append(name)
                telemetry.event(name, severity="warning", step=row.get("step"), value=values[key], **why)

        c = self.cfg
        for phase in PHASES:
            seen, now = self.phases[phase], row.get(phase)
            if now is None or not math.isfinite(now):
                continue
            median = statistics.median(seen) if len(seen) >= c.phase_min_steps else 0.0
            if median > 0:
                ratio = now / median
                alarm(f"phase-stalled/{phase[:-2]}", ratio,
                      ratio > c.phase_stall_factor and now - median > c.phase_stall_min_s, phase=phase)
            seen.append(now)
        ledger = row.get("ledger") or {}
        if ledger.get("expected"):
            share = ledger.get("failed", 0) / ledger["expected"]
            alarm("aborts", share, share > c.abort_share)
        groups: dict[str, set] = {}
        for r in results:
            groups.setdefault(r.group_id, set()).add(r.reward)
        if groups:  # pooled over the last steps: a step's few groups alone are noise (docs/failures.md)
            self.spread.append((len(groups), sum(len(rw) == 1 for rw in groups.values())))
            total = flat = 0
            for n, k in reversed(self.spread):
                total, flat = total + n, flat + k
                if total >= c.no_spread_min_groups:
                    break
            share = flat / total
            alarm("no-spread", share, total >= c.no_spread_min_groups and share >= c.no_spread_share, groups=total)
        if results:
            share = sum(r.end_reason == "truncated" for r in results) / len(results)
            alarm("truncated", share, share >= c.truncated_share)
        peak = row.get("kv_cache_peak")
        if peak is not None:
            alarm("kv-cache", peak, peak > c.kv_cache_max)
        ev = row.get("explained_variance", math.nan)
        if isinstance(ev, float) and math.isfinite(ev):
            self.ev_streak = self.ev_streak + 1 if ev < c.ev_negative_below else 0
            alarm("ev-negative", self.ev_streak, self.ev_streak >= c.ev_negative_steps or ev < c.ev_negative_floor,
                  explained_variance=ev)
        gap = row.get("logprob_gap", math.nan)
        if isinstance(gap, float) and math.isfinite(gap):
            alarm("logprob-gap", gap, gap > c.logprob_gap_max)
        share = retokenized_share(results)
        if share is not None:
            self.retokenized_base = share if self.retokenized_base is None else self.retokenized_base
            rise = share - self.retokenized_base
            alarm("retokenized", share, rise > c.retokenized_rise, rise=round(rise, 4))
        expected, scored = row.get("eval_expected"), row.get("eval_num_trials")
        if expected and scored is not None:  # an evaluation finished with this step
            scored = min(scored, expected - row.get("eval_failed", 0))  # kept failed trials score a zero, no verdict
            alarm("eval-shrinking", scored / expected, scored < (1 - c.eval_shrink_share) * expected,
                  scored=scored, expected=expected)
        return {"health": values, "health_alarms": fired} if values else {}


def retokenized_share(results: list) -> float | None:
    """Loss tokens that went through the retokenized or split relations, over all loss tokens: from the
    chunks a result carries, or the counts it was staged with (the object-store data plane: the
    coordinator holds refs, ``t1ops.campaign.dataplane.stage``). None: no loss token in reach."""
    loss = odd = 0
    for r in results:
        counts = loss_relations(r.chunks) if r.chunks is not None else r.loss_relations
        if counts:
            loss, odd = loss + counts["loss"], odd + counts["retokenized"]
    return odd / loss if loss else None
