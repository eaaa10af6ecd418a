"""Fully async on the rl side: per-token policy versions in TITO, rollout log-probs as the behaviour."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rl.agent.response import policy_version as _version
from rl.chat import IM_END_ID
from rl.engines import protocol as P
from rl.errors import InputError, TitoError
from rl.model import ModelSpec
from rl.tito import TitoBuilder
from rl.trainer import Trainer, TrainerSettings, rollout_batch, sample_responses


def _resp(spans) -> P.GenerateResponse:
    n = spans[-1][2]
    return P.GenerateResponse(output_ids=tuple(range(5, 5 + n)), finish_reason=P.FinishReason(type="length", length=n),
                              weight_version=spans[-1][0], prompt_tokens=3, completion_tokens=n,
                              weight_versions=tuple(P.WeightVersionSpan(v, a, b) for v, a, b in spans))


def test_a_turn_spanning_syncs_keeps_each_tokens_version():
    assert _version(_resp([("3", 0, 4)])) == 3
    per_token = _version(_resp([("3", 0, 2), ("4", 2, 3), ("5", 3, 5)]))
    assert per_token == [3, 3, 4, 5, 5]
    b = TitoBuilder([1, 2, 3], sample_id="s")
    b.add_generation([7, 8, 9, 10, IM_END_ID], [-0.1] * 5, policy_version=per_token)
    (chunk,) = b.finish()
    assert chunk.policy_version.tolist() == [-1, -1, -1, 3, 3, 4, 5, 5]
    b = TitoBuilder([1, 2, 3], sample_id="s")
    with pytest.raises(TitoError, match="2 per-token policy versions"):
        b.add_generation([7, 8, 9], [-0.1] * 3, policy_version=[1, 2])


SPEC = ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_experts=8,
                 moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=64, vocab_size=16)


def _batch(trainer: Trainer, shift: float):
    g = torch.Generator().manual_seed(0)
    prompts = [[1, 4 + i % 3] for i in range(8)]
    seqs = sample_responses(trainer.actor, prompts, 4, generator=g)
    batch = rollout_batch(trainer.actor, seqs, [2] * 8, [float(i % 2) for i in range(8)], group_ids=[i // 2 for i in range(8)],
                          prompt_ids=[i // 2 for i in range(8)])
    batch.rollout_logprobs_BT = torch.where(batch.loss_mask_BT, batch.rollout_logprobs_BT - shift,
                                            batch.rollout_logprobs_BT)
    return batch


def test_trainer_takes_rollout_logprobs_as_the_behaviour_in_fully_async():
    s = TrainerSettings(mode="ppo", r3=False, ppo_epochs=1)
    shift = 0.5  # the rollout sampled under an older policy: its log-probs differ from the current weights
    snap, roll = Trainer(SPEC, s, seed=0), Trainer(SPEC, s, seed=0)
    a = snap.train_step(_batch(snap, shift))
    b = roll.train_step(_batch(roll, shift), behaviour="rollout")
    assert a.ratio_mean == pytest.approx(1.0, abs=1e-4)  # recomputed under the current weights
    assert b.ratio_mean == pytest.approx(float(np.exp(shift)), rel=1e-3)  # pi / mu with mu = rollout
    assert a.logprob_gap == pytest.approx(b.logprob_gap) and b.tis_mean > 1.0
    with pytest.raises(InputError, match="behaviour must be"):
        roll.train_step(_batch(roll, 0.0), behaviour="nope")
