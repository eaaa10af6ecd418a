"""rl.losses: PPO clip, DPPO, value loss, reductions, TIS."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.errors import InputError
from rl.losses import (dppo_loss, dppo_mask, ppo_clip_loss, reduce_loss, reduction_weights, tis_weights,
                       value_loss)

FAST = settings(max_examples=40, deadline=None)
log = math.log


# --- PPO clip ----------------------------------------------------------------
def test_ppo_clip_hand_computed():
    old = torch.log(torch.tensor([[0.2, 0.2, 0.2, 0.2]]))
    new = torch.log(torch.tensor([[0.32, 0.38, 0.2, 0.1]]))  # ratios 1.6, 1.9, 1.0, 0.5
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    loss, stats = ppo_clip_loss(new, old, adv, torch.ones(1, 4))
    # A>0: -min(r, 1.2); A<0: -min(-r, -max(r, 0.8)) = max(r, 0.8) -> 0.8
    assert loss[0].tolist() == pytest.approx([-1.2, -1.2, -1.0, 0.8], abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(0.75)
    assert stats["ratio_mean"] == pytest.approx((1.6 + 1.9 + 1.0 + 0.5) / 4, rel=1e-5)
    assert stats["num_tokens"] == 4


def test_ppo_clip_asymmetric_and_per_trajectory_advantage():
    old = torch.zeros(2, 1)
    new = torch.tensor([[log(1.25)], [log(1.25)]])
    loss, _ = ppo_clip_loss(new, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), clip_low=0.2, clip_high=0.28)
    assert loss.flatten().tolist() == pytest.approx([-1.25, 1.25])


@FAST
@given(st.lists(st.floats(-5, 0), min_size=1, max_size=10), st.lists(st.floats(-3, 3), min_size=10, max_size=10))
def test_ppo_clip_equals_unclipped_surrogate_at_ratio_one(lps, advs):
    lp = torch.tensor([lps], requires_grad=True)
    adv = torch.tensor([advs[:len(lps)]])
    loss, stats = ppo_clip_loss(lp, lp.detach(), adv, torch.ones_like(adv))
    assert torch.allclose(loss, -adv)
    assert stats["clip_fraction"] == 0.0
    loss.sum().backward()  # gradient of -r*A at r=1 is -A
    assert torch.allclose(lp.grad, -adv)


def test_ppo_clip_masked_nan_does_not_leak_into_loss_or_grad():
    lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    loss, _ = ppo_clip_loss(lp, torch.tensor([[-1.0, float("nan")]]), torch.tensor([1.0]), torch.tensor([[1, 0]]))
    reduce_loss(loss, torch.tensor([[1, 0]]), "token_mean").backward()
    assert loss.tolist() == [[-1.0, 0.0]] and lp.grad.tolist() == [[-1.0, 0.0]]


# --- DPPO --------------------------------------------------------------------
def test_dppo_mask_walkthrough_example_and_mirror():
    behaviour = torch.log(torch.full((1, 4), 0.20))
    current = torch.log(torch.tensor([[0.32, 0.38, 0.08, 0.04]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    # +A: dp 0.12 keeps, 0.18 drops; -A: dp -0.12 keeps, -0.16 drops
    assert dppo_mask(current, behaviour, adv).tolist() == [[1.0, 0.0, 1.0, 0.0]]
    # the mask is one-sided: moving against the advantage's direction never drops
    assert dppo_mask(current, behaviour, -adv).tolist() == [[1.0, 1.0, 1.0, 1.0]]


def test_dppo_mask_is_about_probability_not_ratio():
    # ratio 3.0 (way past a PPO clip) but dp = 0.02: DPPO keeps it
    assert dppo_mask(torch.tensor([[log(0.03)]]), torch.tensor([[log(0.01)]]), torch.tensor([[1.0]])).item() == 1.0


def test_dppo_loss_hand_computed():
    behaviour = torch.log(torch.full((1, 3), 0.20))
    current = torch.log(torch.tensor([[0.32, 0.38, 0.2]]))
    loss, stats = dppo_loss(current, behaviour, torch.tensor([2.0]), torch.tensor([[1, 1, 0]]))
    assert loss[0].tolist() == pytest.approx([-1.6 * 2.0, 0.0, 0.0], abs=1e-5)
    assert stats["tv_masked_fraction"] == pytest.approx(0.5)


# --- value loss --------------------------------------------------------------
def test_value_loss_hand_computed():
    values = torch.tensor([[1.0, 0.0, 0.55]])
    old = torch.tensor([[0.5, 0.0, 0.5]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    loss, stats = value_loss(values, old, returns, torch.ones(1, 3), clip=0.2)
    # t0: unclipped 1.0, clipped (0.7-2)^2 = 1.69 -> 0.845; t1: 0.5; t2: inside clip, (0.55)^2/2
    assert loss[0].tolist() == pytest.approx([0.845, 0.5, 0.55 ** 2 / 2], abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(1 / 3)


# --- reductions --------------------------------------------------------------
def test_reductions_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0], [4.0, 4.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    assert reduce_loss(loss, mask, "token_mean").item() == pytest.approx(24 / 6)
    assert reduce_loss(loss, mask, "seq_mean").item() == pytest.approx((2 + 10 + 4) / 3)
    # prompts: p rows 0,1 (4 tokens, sum 16), q row 2 (2 tokens, mean 4)
    assert reduce_loss(loss, mask, "prompt_mean", ["p", "p", "q"]).item() == pytest.approx((16 / 4 + 4) / 2)


def test_prompt_mean_walkthrough_equal_prompt_weight():
    # prompt A: 10,000 valid tokens, prompt B: 100,000 (walkthrough section 7)
    mask = torch.zeros(2, 100_000, dtype=torch.bool)
    mask[0, :10_000] = True
    mask[1, :] = True
    w = reduction_weights(mask, "prompt_mean", ["A", "B"])
    assert float(w[0].sum()) == pytest.approx(0.5) and float(w[1].sum()) == pytest.approx(0.5)
    assert float(reduction_weights(mask, "token_mean")[1].sum()) == pytest.approx(10 / 11)


@st.composite
def masked_batch(draw):
    B = draw(st.integers(1, 6))
    T = draw(st.integers(1, 8))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)))
    mask[0, 0] = True
    loss = torch.tensor(draw(st.lists(st.floats(-100, 100), min_size=B * T, max_size=B * T))).reshape(B, T)
    prompts = draw(st.lists(st.integers(0, 2), min_size=B, max_size=B))
    return loss, mask, prompts


@FAST
@given(masked_batch(), st.sampled_from(["token_mean", "seq_mean", "prompt_mean"]))
def test_reductions_ignore_masked_positions_whatever_their_values(batch, mode):
    loss, mask, prompts = batch
    junk = torch.where(mask, loss, torch.full_like(loss, float("nan")))
    other = torch.where(mask, loss, torch.full_like(loss, 1e9))
    a = reduce_loss(junk, mask, mode, prompts)
    assert torch.isfinite(a) and torch.allclose(a, reduce_loss(other, mask, mode, prompts))


@FAST
@given(masked_batch())
def test_prompt_mean_weights_equal_per_prompt_and_sum_to_one(batch):
    _, mask, prompts = batch
    w = reduction_weights(mask, "prompt_mean", prompts)
    present = [p for p in set(prompts) if mask[torch.tensor([q == p for q in prompts])].any()]
    for p in present:
        rows = torch.tensor([q == p for q in prompts])
        assert float(w[rows].sum()) == pytest.approx(1 / len(present), rel=1e-5)
    assert float(w.sum()) == pytest.approx(1.0, rel=1e-5)
    assert bool((w[~mask] == 0).all())


def test_whole_batch_weights_sliced_per_micro_batch_match_full_reduction():
    torch.manual_seed(0)
    loss, mask = torch.rand(8, 5), torch.rand(8, 5) > 0.3
    mask[:, 0] = True
    prompts = [0, 0, 1, 1, 1, 2, 2, 3]
    w = reduction_weights(mask, "prompt_mean", prompts)
    accumulated = sum(float((w[i:i + 1] * loss[i:i + 1]).sum()) for i in range(8))  # micro-batch size 1
    assert accumulated == pytest.approx(float(reduce_loss(loss, mask, "prompt_mean", prompts)), rel=1e-6)


# --- TIS ---------------------------------------------------------------------
def test_tis_weights_truncated_and_masked():
    old = torch.tensor([[log(0.5), log(0.9), 0.0]])
    rollout = torch.tensor([[log(0.25), log(0.3), 0.0]])  # raw 2.0, 3.0
    w, stats = tis_weights(old, rollout, torch.tensor([[1, 1, 0]]), clip=2.0)
    assert w[0].tolist() == pytest.approx([2.0, 2.0, 0.0])
    assert stats["tis_max_raw"] == pytest.approx(3.0, rel=1e-5)
    assert stats["tis_clip_fraction"] == pytest.approx(0.5)
    assert not w.requires_grad


# --- bad input ---------------------------------------------------------------
def test_shape_mismatch_names_arguments():
    with pytest.raises(InputError) as err:
        ppo_clip_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3), torch.ones(2, 3))
    assert "old_logprobs[2, 4]" in str(err.value) and "mask[2, 3]" in str(err.value)
    with pytest.raises(InputError, match="loss"):
        reduce_loss(torch.zeros(2, 2), torch.ones(2, 3), "token_mean")


def test_nan_on_valid_token_rejected():
    with pytest.raises(InputError, match="logprobs"):
        ppo_clip_loss(torch.tensor([[float("nan")]]), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1))
    with pytest.raises(InputError, match="returns"):
        value_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.tensor([[float("inf")]]), torch.ones(1, 1))


def test_reduction_bad_mode_missing_prompts_empty_mask():
    with pytest.raises(InputError, match="token_mean"):
        reduce_loss(torch.zeros(1, 1), torch.ones(1, 1), "sum")
    with pytest.raises(InputError, match="prompt_ids"):
        reduce_loss(torch.zeros(1, 1), torch.ones(1, 1), "prompt_mean")
    with pytest.raises(InputError, match="prompt_ids has 1 entries but mask has 2 rows"):
        reduce_loss(torch.zeros(2, 1), torch.ones(2, 1), "prompt_mean", [0])
    with pytest.raises(InputError, match="no valid position"):
        reduce_loss(torch.zeros(1, 2), torch.zeros(1, 2), "token_mean")


def test_negative_hyper_parameters_rejected():
    with pytest.raises(InputError, match="clip_low"):
        ppo_clip_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), clip_low=-0.1)
    with pytest.raises(InputError, match="delta_high"):
        dppo_mask(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), delta_high=-1)
    with pytest.raises(InputError, match="clip"):
        value_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), clip=float("nan"))
