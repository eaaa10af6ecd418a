"""metrics-reducer: a group-sum denominator inflates the train-vs-rollout log-prob gap.

T1 report, section 09: the gap was "aggregated with a group-sum denominator under
micro-batch size 1, reporting 163-269 where the true value was ~0.02". Each
micro-batch's token SUM is divided by its number of samples (1), so the "mean"
is a per-sample token sum: the inflation equals the loss tokens per sample.

Fault (real seam): the report's reducer is registered in ``rl.metrics.REDUCERS``
(for this scenario only) and selected by name through the trainer's settings
(``TrainerSettings.gap_reducer``; the campaign config allows only
``token_mean``). The data is real: a bf16 sampler copy of the trainer's policy
samples the responses and scores them (the rollout log-probs); the fp32 trainer
recomputes them in its own step.

Unguarded: the same reducer on the trainer's own log-probs of that batch, with no
self-check: the gap reads ~RESPONSE_LEN times the truth, no error.
Guarded: ``Trainer.train_step`` reduces the gap through
``rl.metrics.checked_logprob_gap``, which runs ``verify_reducer`` against the
direct token mean on every step's data; the step fails with a MetricError naming
the reducer and the ratio. Runbook: ``runbooks/metrics-reducer.md``.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from chaos.harness import Guarded, Outcome, Timeline, register
from rl.errors import MetricError

CHAOS_REDUCER = "group_sum_chaos"
NUM_PROMPTS, PER_PROMPT, PROMPT_LEN, RESPONSE_LEN = 4, 2, 4, 96


def group_sum_reducer(values, masks) -> float:
    """THE FAULT: token sum per micro-batch over a per-sample (group) denominator."""
    per_mb = [float((v * m).sum()) / v.shape[0] for v, m in zip(values, masks)]
    return sum(per_mb) / len(per_mb)


def _batch(trainer, spec, gen: torch.Generator):
    """Responses sampled and scored by a bf16 copy of the trainer's policy (as the engine does)."""
    from rl.model import build_policy
    from rl.trainer import rollout_batch, sample_responses
    from rl.trainer.step import copy_state

    sampler = build_policy(spec, 0, torch.bfloat16)
    sampler.load_state_dict(copy_state(trainer.actor.state_dict()), strict=False)
    prompts = [[1] + [int(x) for x in torch.randint(4, spec.vocab_size, (PROMPT_LEN - 1,), generator=gen)]
               for _ in range(NUM_PROMPTS) for _ in range(PER_PROMPT)]
    seqs = sample_responses(sampler, prompts, RESPONSE_LEN, generator=gen)
    rewards = [float(np.mean(s[PROMPT_LEN:] % 2 == 0)) for s in seqs]
    ids = [i // PER_PROMPT for i in range(len(seqs))]
    return rollout_batch(sampler, seqs, [PROMPT_LEN] * len(seqs), rewards, group_ids=ids, prompt_ids=ids)


@register("metrics-reducer", "a group-sum denominator inflates the log-prob gap at micro-batch size 1")
def run(tmp: Path) -> Outcome:
    from rl import metrics
    from rl.metrics import logprob_gap
    from rl.model import ModelSpec
    from rl.trainer import Trainer, TrainerSettings

    torch.set_num_threads(1)
    spec = ModelSpec(max_seq_len=128, vocab_size=64)
    settings = TrainerSettings(mode="grpo", tis_mode="token")  # the trainer recomputes behaviour log-probs
    gen = torch.Generator().manual_seed(19)
    healthy = Trainer(spec, settings, seed=0)
    batch = _batch(healthy, spec, gen)
    stats = healthy.train_step(batch)  # production reducer: the self-check passes, the step trains

    metrics.REDUCERS[CHAOS_REDUCER] = group_sum_reducer  # the seam; removed below
    try:
        faulty = Trainer(spec, settings.model_copy(update={"gap_reducer": CHAOS_REDUCER}), seed=0)  # unvalidated: the config allows no other
        old_BT = faulty.behaviour_logprobs(batch)
        mask_BT = batch.loss_mask_BT
        true_gap = logprob_gap(old_BT, batch.rollout_logprobs_BT, mask_BT)
        rows = torch.where(mask_BT, (old_BT - batch.rollout_logprobs_BT).abs(), 0.0)
        buggy = group_sum_reducer([r[None] for r in rows], [m[None] for m in mask_BT])  # unguarded: no check
        t0, err = time.monotonic(), None
        tl = Timeline()  # from the step with the faulty reducer; the guard refuses it: the run stops
        tl.fault(at=t0)
        try:
            faulty.train_step(batch)
        except MetricError as e:
            err = e
            tl.detected()
            tl.stopped()
        detection_s = round(time.monotonic() - t0, 4) if err else None
    finally:
        metrics.REDUCERS.pop(CHAOS_REDUCER, None)
    inflation = buggy / true_gap
    per_sample = batch.num_loss_tokens / batch.num_samples
    return Outcome(
        fault_fired=faulty.settings.gap_reducer == CHAOS_REDUCER and err is not None and CHAOS_REDUCER in str(err),
        unguarded=(f"group-sum reducer on the trainer's data reported a log-prob gap of {buggy:.3f} "
                   f"(true {true_gap:.5f}, {inflation:.0f}x = loss tokens per sample); no error"),
        guarded=Guarded(caught=err is not None, detection_s=detection_s, error=str(err or "")),
        invariants={
            "unguarded_gap_inflated_by_tokens_per_sample": abs(inflation - per_sample) <= 0.01 * per_sample,
            "step_refused_names_the_reducer": err is not None and f"{CHAOS_REDUCER} reports" in str(err),
            "healthy_step_gap_is_direct_token_mean": abs(stats.logprob_gap - true_gap) <= 1e-5 * true_gap,
            "chaos_reducer_unregistered_after": CHAOS_REDUCER not in metrics.REDUCERS,
        },
        details={"true_gap": round(true_gap, 6), "buggy_gap": round(buggy, 4), "inflation_x": round(inflation, 1),
                 "loss_tokens_per_sample": per_sample, "healthy_step_gap": stats.logprob_gap},
        recovery=tl.recovery(how="stopped with MetricError before the update; restart with the production "
                                 "reducer (runbook): its step trained above, not timed as a restart"))
