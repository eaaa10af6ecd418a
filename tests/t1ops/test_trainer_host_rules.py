"""The trainer role applies the recipes' critic schedule, entropy logging and per-trajectory GRPO
baseline on its production path (TrainerHost, no Ray)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl.model import ModelSpec, build_policy, token_logprobs
from rl.tito import Trajectory
from rl.vocab import CompactVocab
from t1ops.campaign.credit import assign_credit
from t1ops.campaign.reward_policy import RewardPolicy
from t1ops.campaign.trainer_host import TrainerHost
from t1ops.campaign.trials import TrialResult
from t1ops.config import CampaignConfig, CheckpointsConfig, parse_config


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _host(tmp_path, name: str, **trainer) -> TrainerHost:
    cfg = parse_config({"trainer": trainer}) if trainer else CampaignConfig()
    vocab = CompactVocab(range(300), 248_320, has_unk=True)
    vocab.save(tmp_path / "vocab.json")
    spec = {**cfg.model.model_spec().to_dict(), "hidden_size": 32, "ffn_hidden_size": 64, "moe_ffn_hidden_size": 32,
            "max_seq_len": 128}
    return TrainerHost(spec=spec, settings=cfg.trainer, vocab_path=str(tmp_path / "vocab.json"),
                       ckpt_base=str(tmp_path / name), seed=0,
                       retention=CheckpointsConfig(keep_last=None, keep_every=0))


def _chunk(sample: str, seed: int) -> Trajectory:
    rng = np.random.default_rng(seed)
    n = 12
    mask = np.array([0] * 6 + [1] * 6, dtype=np.int8)
    return Trajectory(tokens=rng.integers(1, 290, n).astype(np.int64), loss_mask=mask,
                      rollout_logprobs=np.where(mask == 1, -3.0, 0.0).astype(np.float32),
                      engine_tokens=np.zeros(n, dtype=np.int64), origin=np.zeros(n, dtype=np.int8),
                      policy_version=np.where(mask == 1, 0, -1).astype(np.int32), routing=None,
                      meta={"sample_id": sample, "relations": ["strict"]})


def _result(sample: str, reward: float, chunks: int) -> TrialResult:
    return TrialResult(sample_id=sample, group_id="g", task="t", reward=reward, passed=1, total=1, num_turns=1,
                       end_reason="done", chunks=[_chunk(sample, i) for i in range(chunks)])


@pytest.mark.slow  # three PPO steps of a megatron model on CPU
def test_critic_warm_load_then_critic_only_steps_with_entropy_logged(tmp_path):
    donor = _host(tmp_path, "donor", r3=False)
    donor.publish(0)  # saves the critic (step 0 % save_every == 0)
    host = _host(tmp_path, "warm", r3=False, critic_warmup_steps=2,
                 critic_warm_load=str(tmp_path / "donor" / "critic"))
    assert host.warm_loaded_critic.endswith("step_00000000")
    assert all(torch.equal(a, b) for a, b in zip(host.trainer.critic.state_dict().values(),
                                                 donor.trainer.critic.state_dict().values())
               if isinstance(a, torch.Tensor))
    host.publish(0)
    results = [_result("a", 1.0, 1), _result("b", 0.0, 1)]
    steps = [host.train(assign_credit(results, RewardPolicy())).stats for _ in range(3)]
    assert [s.actor_updated for s in steps] == [False, False, True]
    assert all(math.isfinite(s.entropy) and s.entropy > 0 for s in steps)


def test_entropy_is_the_sampling_distribution_entropy_without_gradient():
    spec = ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_experts=8,
                     moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=64, vocab_size=16)
    model = build_policy(spec, 0)
    ids = torch.tensor([[1, 5, 7, 2]])
    lp, ent = token_logprobs(model, ids, torch.tensor([[5, 7, 2, 3]]), temperature=0.7, with_entropy=True)
    with torch.no_grad():
        full = torch.stack([token_logprobs(model, ids, torch.full_like(ids, v), temperature=0.7)
                            for v in range(16)], dim=-1)
    assert lp.requires_grad and not ent.requires_grad
    torch.testing.assert_close(ent, -(full.exp() * full).sum(-1), atol=1e-4, rtol=1e-4)


def test_grpo_batch_counts_trajectories_not_chunks(tmp_path):
    host = _host(tmp_path, "grpo", mode="grpo", r3=False)
    batch = host.build_batch(assign_credit([_result("a", 1.0, 3), _result("b", 0.0, 1)], RewardPolicy()))
    from rl.trainer.step import grpo_token_advantages

    assert grpo_token_advantages(batch).tolist() == [0.5, 0.5, 0.5, -0.5]


def _in_group(sample: str, group: str, reward: float, chunks: int = 1) -> TrialResult:
    return TrialResult(sample_id=sample, group_id=group, task="t", reward=reward, passed=1, total=1, num_turns=1,
                       end_reason="done", chunks=[_chunk(sample, i) for i in range(chunks)])


def test_prompt_mean_weighs_each_group_not_each_task(tmp_path):
    """Two groups of one task are two prompts (walkthrough, section 7): each weighs 1/2, whatever
    their token counts. Failed before issue 50: the batch's prompt ids were task names (one prompt)."""
    from rl.losses import reduction_weights

    host = _host(tmp_path, "pm", mode="grpo", r3=False, loss_reduction="prompt_mean")
    trials = [_in_group("g1-s0", "g1", 1.0, 3), _in_group("g1-s1", "g1", 0.0),
              _in_group("g2-s0", "g2", 1.0), _in_group("g2-s1", "g2", 0.0)]
    batch = host.build_batch(assign_credit(trials, RewardPolicy(group_relative=True)))
    assert batch.prompt_ids == ["g1"] * 4 + ["g2"] * 2
    w = reduction_weights(batch.loss_mask_BT, "prompt_mean", batch.prompt_ids)
    assert float(w[:4].sum()) == pytest.approx(0.5) and float(w[4:].sum()) == pytest.approx(0.5)


@pytest.mark.slow  # two GRPO steps of a megatron model on CPU
def test_a_flat_grpo_batch_skips_the_optimizer_step_and_leaves_the_weights(tmp_path):
    """Every group's trained rewards equal: every advantage is 0, yet Adam's momentum and weight decay
    would move the weights. The step is skipped and says why. Failed before issue 50 (the weights moved)."""
    host = _host(tmp_path, "flat", mode="grpo", r3=False)
    host.publish(0)
    policy = RewardPolicy(group_relative=True)
    first = host.train(assign_credit([_in_group("a-s0", "a", 1.0), _in_group("a-s1", "a", 0.0)], policy))
    assert first.skipped is None and first.actor_updated  # a real step: the optimizer now has momentum
    before = [p.detach().clone() for p in host.trainer.actor.parameters()]
    flat = assign_credit([_in_group("b-s0", "b", 1.0), _in_group("b-s1", "b", 1.0)], policy)
    report = host.train(flat)
    assert report.stats is None and "GRPO advantages are all 0" in report.skipped and not report.actor_updated
    assert all(torch.equal(a, b) for a, b in zip(before, host.trainer.actor.parameters()))
