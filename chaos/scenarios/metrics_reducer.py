"""metrics-reducer: a group-sum denominator inflates the train-vs-rollout log-prob gap.

Fault (real): the report's buggy reducer (T1 report, section 09: "aggregated with
a group-sum denominator under micro-batch size 1, reporting 163-269 where the
true value was ~0.02") is plugged into the metric pipeline through its reducer
seam (``rl.metrics.Reducer``: per-micro-batch token values and masks -> one
number). Each micro-batch's token SUM is divided by the number of samples in it,
which is 1 at micro-batch size 1, so the "mean" is a per-sample token sum: the
inflation equals the loss-token count per sample (~8-13k for the report's
trajectories, i.e. 0.02 -> 163-269).

The batch mirrors the report's: per-token gaps of mean 0.02 (section 05: 0.021
before mitigation), trajectories of 8,150-13,450 loss tokens (163 / 0.02 and
269 / 0.02) interleaved with observation tokens that carry no loss.

Guard: ``rl.metrics.logprob_gap`` (one token reducer, defined once) equals an
independent direct computation at micro-batch size 1 and 4, and
``rl.metrics.verify_reducer`` rejects the buggy reducer with a MetricError.
Runbook: ``runbooks/metrics-reducer.md``.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from chaos.harness import Guarded, Outcome, register
from rl.errors import MetricError
from rl.metrics import logprob_gap, token_mean_over, verify_reducer

TRUE_GAP = 0.02                        # report: ~0.02 per token
LOSS_TOKENS = (8_150, 13_450)          # 163 / 0.02 and 269 / 0.02: the report's 163-269 band
NUM_STEPS, TRAJ_PER_STEP = 3, 8


def group_sum_reducer(values: list[torch.Tensor], masks: list[torch.Tensor]) -> float:
    """THE FAULT: token sum per micro-batch over a per-sample (group) denominator."""
    per_mb = [float((v * m).sum()) / v.shape[0] for v, m in zip(values, masks)]
    return sum(per_mb) / len(per_mb)


def _trajectory(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One [1, T] trajectory: turns of sampled tokens (loss) and observations (no loss)."""
    num_loss = int(torch.randint(*LOSS_TOKENS, (1,), generator=gen))
    num_turns = 20
    turn_loss = np.diff(np.linspace(0, num_loss, num_turns + 1).astype(int))
    mask = torch.cat([torch.cat([torch.zeros(150, dtype=torch.bool), torch.ones(int(n), dtype=torch.bool)])
                      for n in turn_loss])[None]
    rollout = torch.log(torch.rand(mask.shape, generator=gen).clamp(min=1e-4))
    # |N(0, s)| has mean s * sqrt(2 / pi): choose s so the true per-token gap is TRUE_GAP
    noise = torch.randn(mask.shape, generator=gen) * TRUE_GAP * (np.pi / 2) ** 0.5
    train = rollout + noise
    rollout = torch.where(mask, rollout, 0.0)  # data contract: 0 rollout log-prob off the loss region
    return train, rollout, mask


def _direct(trains, rollouts, masks) -> float:
    """Independent reference: every loss token of the batch in one numpy vector."""
    flat = np.concatenate([(t - r).abs()[m].numpy().astype(np.float64) for t, r, m in zip(trains, rollouts, masks)])
    return float(flat.mean())


def _regroup(xs: list[torch.Tensor], size: int) -> list[torch.Tensor]:
    """Micro-batches of ``size`` trajectories, right-padded (pads are masked out)."""
    out = []
    for i in range(0, len(xs), size):
        chunk = xs[i:i + size]
        T = max(x.shape[1] for x in chunk)
        out.append(torch.cat([torch.nn.functional.pad(x.to(torch.float32), (0, T - x.shape[1])) for x in chunk]))
    return out


@register("metrics-reducer", "a group-sum denominator inflates the log-prob gap ~1000x at micro-batch size 1")
def run(tmp: Path) -> Outcome:
    gen = torch.Generator().manual_seed(20)
    buggy, per_mb, direct, ours_mb1, ours_mb4, steps = [], [], [], [], [], []
    for _ in range(NUM_STEPS):
        trains, rollouts, masks = zip(*(_trajectory(gen) for _ in range(TRAJ_PER_STEP)))
        gaps = [torch.where(m, (t - r).abs(), 0.0) for t, r, m in zip(trains, rollouts, masks)]
        buggy.append(group_sum_reducer(gaps, list(masks)))         # micro-batch size 1, unguarded
        per_mb += [group_sum_reducer([g], [m]) for g, m in zip(gaps, masks)]  # what each micro-batch logs
        direct.append(_direct(trains, rollouts, masks))
        ours_mb1.append(logprob_gap(list(trains), list(rollouts), list(masks)))
        ours_mb4.append(logprob_gap(_regroup(list(trains), 4), _regroup(list(rollouts), 4),
                                    [m.bool() for m in _regroup(list(masks), 4)]))
        steps.append((gaps, list(masks)))
    inflation = min(b / d for b, d in zip(buggy, direct))
    fault_fired = inflation >= 1000  # observed: the buggy number really is >= 1000x the truth

    t0 = time.monotonic()
    try:
        verify_reducer(group_sum_reducer, *steps[0], name="group_sum_reducer")
        caught, error = False, "verify_reducer accepted the group-sum reducer"
    except MetricError as err:
        caught, error = True, str(err)
    detection_s = time.monotonic() - t0
    verify_reducer(token_mean_over, *steps[0], name="rl.metrics.token_mean_over")  # raises if ours drifted

    close = lambda a, b: all(abs(x - y) <= 1e-6 * y for x, y in zip(a, b))  # noqa: E731
    return Outcome(
        fault_fired=fault_fired,
        unguarded=(f"group-sum reducer at micro-batch size 1 reported a log-prob gap of "
                   f"{min(buggy):.0f}-{max(buggy):.0f} per step, {min(per_mb):.0f}-{max(per_mb):.0f} per "
                   f"micro-batch (true {np.mean(direct):.4f}, {inflation:.0f}x and more); "
                   "no error, mismatch looks catastrophic"),
        guarded=Guarded(caught=caught, detection_s=round(detection_s, 4), error=error),
        invariants={"unguarded_gap_inflated_1000x": inflation >= 1000,
                    "gap_matches_direct_mbs1": close(ours_mb1, direct),
                    "gap_matches_direct_mbs4": close(ours_mb4, direct),
                    "gap_near_report_0.02": all(0.015 <= g <= 0.025 for g in ours_mb1)},
        details={"buggy_gap": [round(b, 2) for b in buggy],
                 "buggy_per_microbatch_range": [round(min(per_mb), 1), round(max(per_mb), 1)], "direct_gap": [round(d, 6) for d in direct],
                 "project_gap_mbs1": [round(g, 6) for g in ours_mb1],
                 "project_gap_mbs4": [round(g, 6) for g in ours_mb4], "min_inflation_x": round(inflation)})
