"""Equivalence: a TP=2 (+SP), an EP=2 and a DP=2 trainer against the 1-rank trainer, R3 replay on.

Same batch, same initial weights (layout-free, rl.trainer.ranks.full_initial_states), one PPO
step (critic + actor, ppo_epochs=1). Tolerances: per-token log-probs within 1e-5 (absolute, loss
tokens), policy loss, value loss and both grad norms within 1e-5 (relative), weights after the step
within 1e-4 (Adam's first step divides by |g|, so 1e-7 grad differences show as ~1e-6). The small
max_tokens_per_gpu cuts every rank's share into several micro-batches (gradient accumulation).
Each test spawns 2 real rank processes (gloo, groups through t1ops.guards.dist).
"""
import pytest
import torch

from rl import model as rmodel
from rl.trainer import Trainer, TrainerSettings, rollout_batch, sample_responses
from rl.trainer.forward import actor_logprobs
from rl.trainer.ranks import Layout
from t1ops.campaign.trainer_rank import run_local_ranks

SPEC = rmodel.ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_experts=4,
                        moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=64, vocab_size=64)
SETTINGS = TrainerSettings(mode="ppo", ppo_epochs=1, r3=True, actor_lr=1e-3)
CAP = 40  # tokens per micro-batch: 2-3 micro-batches per rank
TEMPERATURE = 0.8  # the trainer's log-probs are at the sampling temperature


@pytest.fixture(scope="module")
def reference():
    t = Trainer(SPEC, SETTINGS, seed=0, temperature=TEMPERATURE)
    sampler = rmodel.build_policy(SPEC, seed=7, dtype=torch.bfloat16)  # another numerical implementation
    rmodel.load_state(sampler, rmodel.weights_state_dict(t.actor))
    seqs = sample_responses(sampler, [[1, 2, 3, 4]] * 6, 12, generator=torch.Generator().manual_seed(0))
    seqs = [s[: 8 + (i % 4) * 2] for i, s in enumerate(seqs)]  # lengths 8..14: packing has work to do
    batch = rollout_batch(sampler, seqs, [4] * 6, [0.1 * i for i in range(6)], [i // 2 for i in range(6)],
                          [i // 2 for i in range(6)], temperature=TEMPERATURE)
    logprobs = actor_logprobs(t.actor, batch, replay=True, temperature=TEMPERATURE).detach()
    stats = t.train_step(batch)
    return batch, logprobs, stats, rmodel.weights_state_dict(t.actor)


@pytest.mark.parametrize("layout", [Layout(tp=2, sequence_parallel=True, max_tokens_per_gpu=CAP),
                                    Layout(dp=2, ep=2, max_tokens_per_gpu=CAP),
                                    Layout(dp=2, max_tokens_per_gpu=CAP)], ids=["tp2-sp", "ep2", "dp2"])
def test_layout_matches_one_rank(reference, layout):
    batch, ref_lp, ref, ref_actor = reference
    got = run_local_ranks(layout, batch, SPEC, SETTINGS, seed=0, temperature=TEMPERATURE)
    assert got["micro_batches"] >= 2  # gradient accumulation is exercised
    mask = batch.loss_mask_BT
    assert float((got["logprobs"] - ref_lp)[mask].abs().max()) <= 1e-5
    assert ref.logprob_gap > 0  # the bf16 sampler differs: the gap is a real number, not 0 == 0
    for key in ("policy_loss", "value_loss", "actor_grad_norm", "critic_grad_norm", "explained_variance",
                "logprob_gap", "tis_mean"):
        assert got["stats"][key] == pytest.approx(getattr(ref, key), rel=1e-5, abs=1e-7), key
    assert set(got["actor"]) == set(ref_actor)  # gathered from the ranks: a full, layout-free state
    assert max(float((got["actor"][k] - v).abs().max()) for k, v in ref_actor.items()) <= 1e-4
