"""retried-train-step: a retry after a lost response repeats the optimizer step.

SkyRL issue #2035 (github.com/NovaSky-AI/SkyRL/issues/2035): the client of a remote trainer retried a
call whose response was lost (a timeout, a dropped connection); the trainer had already applied it,
so the optimizer step ran twice (or the gradients were accumulated twice). No error.

Fault (real): the production trainer role (``TrainerHost``, GRPO, one tiny batch) trains step 1; its
response is lost on the way back and the caller sends the same call again.

- Unguarded (the call without its step number, as an idempotency-blind client sends it): the second
  call runs the optimizer again: the actor's weights are two steps from the start, not one.
- Guarded: the coordinator sends the campaign step with every call (``train(credit,
  behaviour, step)``); ``TrainerHost.train`` asks ``StepLedger`` first: the retry of step 1 gets step
  1's stats back and trains nothing (a ``trainer.step_repeated`` event), so the weights are exactly
  those of one step; a call for an older step would be a ``DataContractError``; step 2 trains
  normally.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from chaos.harness import Guarded, Outcome, Timeline, register
from t1ops import telemetry
from t1ops.errors import DataContractError


def _host(tmp: Path, name: str):
    from chaos.trainer_fixture import tiny_trainer_host
    from t1ops.config import CheckpointsConfig

    host = tiny_trainer_host(tmp, name, CheckpointsConfig(keep_last=None, keep_every=0), mode="grpo", r3=False,
                             save_every=100)
    host.publish(0)
    return host


def _results():
    from rl.tito import Trajectory
    from t1ops.campaign.credit import assign_credit
    from t1ops.campaign.reward_policy import RewardPolicy
    from t1ops.campaign.trials import TrialResult

    def chunk(seed: int) -> Trajectory:
        rng = np.random.default_rng(seed)
        n, mask = 12, np.array([0] * 6 + [1] * 6, dtype=np.int8)
        return Trajectory(tokens=rng.integers(1, 290, n).astype(np.int64), loss_mask=mask,
                          rollout_logprobs=np.where(mask == 1, -3.0, 0.0).astype(np.float32),
                          engine_tokens=np.zeros(n, dtype=np.int64), origin=np.zeros(n, dtype=np.int8),
                          policy_version=np.where(mask == 1, 0, -1).astype(np.int32), routing=None,
                          meta={"sample_id": f"s{seed}", "relations": ["strict"]})
    results = [TrialResult(sample_id=f"s{i}", group_id="g", task="t", reward=float(i), passed=i, total=1,
                           num_turns=1, end_reason="done", chunks=[chunk(i)]) for i in range(2)]
    return assign_credit(results, RewardPolicy())  # the coordinator's credit stage: what the trainer executes


def _actor(host) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in host.trainer.actor_state().items() if isinstance(v, torch.Tensor)}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@register("retried-train-step", "a retry after a lost response repeats the optimizer step")
def run(tmp: Path) -> Outcome:
    torch.set_num_threads(1)
    results = _results()
    reference = _host(tmp, "reference")
    reference.train(results, step=1)
    one_step = _actor(reference)

    bad = _host(tmp, "unguarded")
    bad.train(results)
    bad.train(results)          # the retry of the call whose response was lost
    bad_once = _same(_actor(bad), one_step)

    tl = Timeline()
    good = _host(tmp, "guarded")
    good.train(results, step=1)
    tl.fault()                  # the response is lost; the caller retries
    since = time.time()
    t0 = time.monotonic()
    first = good.steps_applied.last_stats
    again = good.train(results, step=1)
    detect_s = time.monotonic() - t0
    repeated = telemetry.recent_events("trainer.step_repeated", since=since)
    tl.detected()
    good_once = _same(_actor(good), one_step)
    try:
        good.train(results, step=0)
        older = None
    except DataContractError as e:
        older = e
    good.publish(1)
    nxt = good.train(results, step=2)
    tl.healthy()
    return Outcome(
        fault_fired=not bad_once,
        unguarded="the retried train call ran the optimizer again: the actor is two steps from the start, not one; "
                  "no error",
        guarded=Guarded(caught=bool(repeated) and again is first and good_once, detection_s=detect_s,
                        error=f"trainer.step_repeated: the retry of step 1 answered step 1's stats, nothing trained; "
                              f"an older step: {older}"[:300]),
        invariants={
            "unguarded_optimizer_step_repeated": not bad_once,
            "retry_answered_with_the_first_result": again is first and bool(repeated),
            "guarded_weights_are_one_step": good_once,
            "an_older_step_refused": isinstance(older, DataContractError),
            "next_step_trains": nxt.stats is not None and good.steps_applied.last == 2,  # a TrainReport that stepped
        },
        details={"deterministic_reference": "a third trainer, same seed and batch, one step"},
        recovery=tl.recovery(how="the retry answered with the first result; nothing trained twice"))
