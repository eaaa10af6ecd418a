"""PPO numerics: log-ratio clamp, dual clip, TIS modes, sampling temperature, GRPO warm-up,
advantage normalisation options, the skipped behaviour recompute (docs/campaign.md).

Every test name contains "trainer" or "numerics" so ``pytest -k numerics`` selects them.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl.advantages import whiten_advantages
from rl.losses import LOG_RATIO_CLAMP, dppo_loss, ppo_clip_loss, reduce_loss, tis_weights
from rl.model import ModelSpec
from rl.trainer import Trainer, TrainerSettings, rollout_batch, sample_responses
from rl.trainer.step import copy_state

SPEC = ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_experts=8,
                 moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=64, vocab_size=16)
BOS, TARGET, PROMPT_LEN, RESPONSE_LEN = 1, 3, 2, 4


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _batch(sampler, seed: int, num_prompts: int = 2, n_per_prompt: int = 4, temperature: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    prompts = [[BOS, int(x)] for x in torch.randint(4, SPEC.vocab_size, (num_prompts,), generator=g)
               for _ in range(n_per_prompt)]
    seqs = sample_responses(sampler, prompts, RESPONSE_LEN, temperature=temperature, generator=g)
    rewards = [float(np.mean(s[PROMPT_LEN:] == TARGET)) + 0.1 * (i % 3) for i, s in enumerate(seqs)]
    ids = [i // n_per_prompt for i in range(len(seqs))]
    return rollout_batch(sampler, seqs, [PROMPT_LEN] * len(seqs), rewards, group_ids=ids, prompt_ids=ids,
                         temperature=temperature)


def _moved(state, before) -> bool:
    return any(isinstance(v, torch.Tensor) and not torch.equal(v, before[k]) for k, v in state.items())


# --- the log-ratio clamp --------------------------------------------------------------
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_numerics_ppo_log_ratio_100_gives_finite_loss_and_grad(adv):
    lp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-100.0, -1.0]])  # log-ratio 100 on token 0: exp overflows fp32 without the clamp
    loss_BT, stats = ppo_clip_loss(lp, old, torch.tensor([adv]), torch.ones(1, 2))
    reduce_loss(loss_BT, torch.ones(1, 2), "token_mean").backward()
    assert torch.isfinite(loss_BT).all() and torch.isfinite(lp.grad).all(), (loss_BT, lp.grad)
    assert stats["ratio_max"] == pytest.approx(math.exp(LOG_RATIO_CLAMP), rel=1e-5)


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_numerics_dppo_log_ratio_100_gives_finite_loss_and_grad(adv):
    lp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    loss_BT, _ = dppo_loss(lp, torch.tensor([[-100.0, -1.0]]), torch.tensor([adv]), torch.ones(1, 2))
    reduce_loss(loss_BT, torch.ones(1, 2), "token_mean").backward()
    assert torch.isfinite(loss_BT).all() and torch.isfinite(lp.grad).all(), (loss_BT, lp.grad)


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_numerics_tis_log_ratio_100_is_finite(mode):
    w, stats = tis_weights(torch.tensor([[0.0, -1.0]]), torch.tensor([[-100.0, -1.0]]), torch.ones(1, 2),
                           clip=2.0, mode=mode)
    assert torch.isfinite(w).all() and math.isfinite(stats["tis_max_raw"])
    assert w.tolist() == ([[2.0, 1.0]] if mode == "token" else [[2.0, 2.0]])


# --- dual clip ---------------------------------------------------------------------------
def test_numerics_dual_clip_bounds_negative_advantage_loss():
    old = torch.zeros(1, 3)
    lp = torch.tensor([[math.log(10.0), math.log(2.0), math.log(10.0)]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    plain, _ = ppo_clip_loss(lp, old, adv, torch.ones(1, 3))
    assert plain[0].tolist() == pytest.approx([10.0, 2.0, -1.2], rel=1e-5)  # unbounded in r for A < 0
    loss, stats = ppo_clip_loss(lp, old, adv, torch.ones(1, 3), clip_ratio_c=3.0)
    assert loss[0].tolist() == pytest.approx([3.0, 2.0, -1.2], rel=1e-5)  # -c*A caps token 0 only
    assert stats["dual_clip_fraction"] == pytest.approx(1 / 3)
    loss.sum().backward()
    assert lp.grad[0, 0] == 0.0 and lp.grad[0, 1] != 0.0
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_loss(lp, old, adv, torch.ones(1, 3), clip_ratio_c=1.0)


def test_numerics_trainer_dual_clip_setting_reaches_the_loss():
    batch = _batch(Trainer(SPEC, TrainerSettings(), seed=0).actor, seed=1)
    batch.rewards_B = -batch.rewards_B - 1.0  # every advantage negative
    behaviour = Trainer(SPEC, TrainerSettings(), seed=9).actor_state()  # ratios far from 1 both ways
    out = {}
    for c in (None, 1.5):
        t = Trainer(SPEC, TrainerSettings(mode="ppo", actor_lr=1e-2, clip_ratio_c=c), seed=0)
        t.set_behaviour(behaviour)
        stats = t.train_step(batch)
        out[c] = (stats.dual_clip_fraction, copy_state(t.actor_state()))
    assert out[1.5][0] > 0 and out[None][0] == 0.0
    assert _moved(out[1.5][1], out[None][1])


# --- TIS modes ---------------------------------------------------------------------------
def test_numerics_tis_sequence_mode_one_weight_per_row():
    old = torch.tensor([[0.0, math.log(2.0), math.log(1.5)], [0.0, math.log(0.5), 0.0]])
    rollout = torch.zeros(2, 3)
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    w, stats = tis_weights(old, rollout, mask, clip=10.0, mode="sequence")
    assert w.flatten().tolist() == pytest.approx([0.0, 3.0, 3.0, 0.0, 0.5, 0.0], rel=1e-5)
    w_tok, _ = tis_weights(old, rollout, mask, clip=10.0, mode="token")
    assert w_tok.flatten().tolist() == pytest.approx([0.0, 2.0, 1.5, 0.0, 0.5, 0.0], rel=1e-5)


def _perturbed(batch, delta: float):
    b = batch.__class__(**vars(batch))
    b.rollout_logprobs_BT = torch.where(batch.loss_mask_BT, batch.rollout_logprobs_BT - delta, 0.0)
    return b


@pytest.mark.parametrize("mode", ["off", "token", "sequence"])
def test_numerics_trainer_tis_applied_only_when_on_and_logged_always(mode):
    batch = _batch(Trainer(SPEC, TrainerSettings(), seed=0).actor, seed=2)
    states = []
    for b in (batch, _perturbed(batch, 0.3)):
        t = Trainer(SPEC, TrainerSettings(mode="ppo", actor_lr=1e-2, tis_mode=mode, tis_cap=5.0), seed=0)
        stats = t.train_step(b)
        assert stats.tis_mode == mode and math.isfinite(stats.tis_mean) and stats.tis_mean > 0
        states.append(copy_state(t.actor_state()))
    # PPO's ratio is against the recomputed old log-probs: only applied TIS lets the sampler's change the step
    assert _moved(states[1], states[0]) is (mode != "off")


# --- sampling temperature -------------------------------------------------------------------
def test_numerics_trainer_logprobs_at_the_sampling_temperature():
    T = 0.5
    sampler = Trainer(SPEC, TrainerSettings(mode="grpo"), seed=0).actor
    batch = _batch(sampler, seed=3, temperature=T)  # rollout log-probs of the temperature-scaled policy
    mask = batch.loss_mask_BT
    same = Trainer(SPEC, TrainerSettings(mode="ppo"), seed=0, temperature=T)
    same.snapshot_behaviour()
    assert torch.equal(same.behaviour_logprobs(batch)[mask], batch.rollout_logprobs_BT[mask])
    stats = same.train_step(batch)
    assert stats.logprob_gap == 0.0
    at_one = Trainer(SPEC, TrainerSettings(mode="ppo"), seed=0)  # the old behaviour: T ignored
    at_one.snapshot_behaviour()
    assert at_one.train_step(batch).logprob_gap > 0.01
    greedy = Trainer(SPEC, TrainerSettings(mode="ppo"), seed=0, temperature=0.0)
    assert greedy.temperature == 1.0  # greedy engines report unscaled log-probs


# --- GRPO warm-up, recompute skip, normalisation ---------------------------------------------
def test_numerics_trainer_grpo_warmup_neither_freezes_actor_nor_builds_critic():
    t = Trainer(SPEC, TrainerSettings(mode="grpo", actor_lr=1e-2, critic_warmup_steps=2), seed=0)
    assert t.critic is None and t.critic_optimizer is None
    before = copy_state(t.actor_state())
    stats = t.train_step(_batch(t.actor, seed=4))
    assert stats.actor_updated and _moved(t.actor_state(), before)


def test_numerics_trainer_grpo_skips_behaviour_recompute_unless_tis_needs_it(monkeypatch):
    for mode, tis, expected in (("grpo", "off", False), ("grpo", "token", True), ("ppo", "off", True)):
        t = Trainer(SPEC, TrainerSettings(mode=mode, actor_lr=1e-2, tis_mode=tis), seed=0)
        calls = []
        real = t.behaviour_logprobs
        monkeypatch.setattr(t, "behaviour_logprobs", lambda b, **kw: calls.append(1) or real(b, **kw))
        t.snapshot_behaviour()
        stats = t.train_step(_batch(t.actor, seed=5))
        assert bool(calls) is expected and stats.behaviour_recomputed is expected, (mode, tis)
        assert math.isfinite(stats.logprob_gap) and math.isfinite(stats.tis_mean)
        if mode == "grpo" and tis == "off":
            assert stats.logprob_gap < 1e-3  # measured on the first epoch's forward of the same weights


def test_numerics_whiten_advantages():
    adv = torch.tensor([[0.0, 1.0, 2.0, 99.0], [0.0, 3.0, 4.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 0]]).bool()
    w = whiten_advantages(adv, mask)
    assert float(w[mask].mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(w[mask].std()) == pytest.approx(1.0, rel=1e-5)
    assert w[~mask].abs().sum() == 0


def test_numerics_trainer_advantage_whitening_option():
    batch = _batch(Trainer(SPEC, TrainerSettings(), seed=0).actor, seed=6)
    batch.rewards_B = batch.rewards_B + 5.0  # a fresh critic: every raw advantage is far above 0
    means = {}
    for on in (False, True):
        t = Trainer(SPEC, TrainerSettings(mode="ppo", advantage_whitening=on), seed=0)
        means[on] = t.train_step(batch).advantage_mean
    assert means[False] > 1.0 and means[True] == pytest.approx(0.0, abs=1e-5)


def test_numerics_trainer_grpo_std_normalisation_option():
    batch = _batch(Trainer(SPEC, TrainerSettings(), seed=0).actor, seed=7)
    batch.rewards_B = torch.tensor([0.0, 0.0, 0.0, 4.0, 0.0, 1.0, 2.0, 3.0])
    from rl.trainer.step import grpo_token_advantages
    raw, normed = grpo_token_advantages(batch, False), grpo_token_advantages(batch, True)
    assert raw[3] == pytest.approx(3.0) and normed[3] == pytest.approx(3.0 / 2.0, rel=1e-4)
    seen = []
    import rl.trainer.ranks as tr  # the one step (the 1-rank Trainer is its world-of-1 case)
    for on in (False, True):
        orig = tr.grpo_token_advantages
        tr.grpo_token_advantages = lambda b, n, _o=orig: seen.append(n) or _o(b, n)
        try:
            Trainer(SPEC, TrainerSettings(mode="grpo", grpo_norm_by_std=on), seed=0).train_step(batch)
        finally:
            tr.grpo_token_advantages = orig
    assert seen == [False, True]


def test_numerics_defaults_match_the_report():
    s = TrainerSettings()
    assert (s.tis_mode, s.clip_ratio_c, s.advantage_whitening, s.grpo_norm_by_std) == ("off", None, False, False)
