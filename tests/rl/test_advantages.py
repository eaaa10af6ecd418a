"""rl.advantages: GAE and GRPO, hand-computed cases, invariances, bad input."""
from __future__ import annotations

import math
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.advantages import compute_gae, grpo_advantages, place_terminal_reward
from rl.errors import InputError, RewardError, T1OpsError

FAST = settings(max_examples=40, deadline=None)


# --- GAE: hand-computed ------------------------------------------------------
def test_gae_gamma_lambda_one_is_return_minus_value_with_mask_gap():
    # row 0: valid t=0..2, reward 1 on t=2; row 1: valid t=0,2,3 (t=1 is an observation), reward 2 on t=3
    values = torch.tensor([[0.5, 0.2, 0.1, 9.0], [0.0, 0.3, 0.2, 0.1]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]])
    adv, ret = compute_gae(torch.tensor([1.0, 2.0]), values, mask)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.8, 0.9, 0.0], [2.0, 0.0, 1.8, 1.9]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.0, 0.0, 2.0, 2.0]]))


def test_gae_hand_computed_gamma_lambda():
    # one row, 3 valid tokens, reward 1 on the last; gamma 0.9, lambda 0.8
    v = [0.5, 0.2, 0.1]
    d2 = 1.0 - 0.1                      # r + gamma*0 - V2
    d1 = 0.9 * 0.1 - 0.2                # gamma*V2 - V1
    d0 = 0.9 * 0.2 - 0.5
    a2 = d2
    a1 = d1 + 0.72 * a2
    a0 = d0 + 0.72 * a1
    adv, ret = compute_gae(torch.tensor([1.0]), torch.tensor([v]), torch.ones(1, 3), gamma=0.9, lam=0.8)
    assert torch.allclose(adv, torch.tensor([[a0, a1, a2]]))
    assert torch.allclose(ret, torch.tensor([[a0 + 0.5, a1 + 0.2, a2 + 0.1]]))


def test_gae_lambda_zero_is_one_step_td():
    adv, _ = compute_gae(torch.tensor([1.0]), torch.tensor([[0.5, 0.2]]), torch.ones(1, 2), gamma=1.0, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[0.2 - 0.5, 1.0 - 0.2]]))


def test_gae_token_rewards_equal_terminal_placement():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    values = torch.rand(2, 4)
    token_rewards = place_terminal_reward(torch.tensor([0.3, 0.7]), mask)
    assert torch.allclose(token_rewards, torch.tensor([[0, 0.3, 0, 0], [0, 0, 0, 0.7]]))
    a1, r1 = compute_gae(token_rewards, values, mask, gamma=0.95, lam=0.9)
    a2, r2 = compute_gae(torch.tensor([0.3, 0.7]), values, mask, gamma=0.95, lam=0.9)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)


def test_gae_drops_value_gradient():
    values = torch.rand(1, 3, requires_grad=True)
    adv, _ = compute_gae(torch.tensor([1.0]), values, torch.ones(1, 3))
    assert not adv.requires_grad


# --- GAE: properties ---------------------------------------------------------
@st.composite
def gae_batch(draw):
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 12))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)))
    mask[:, 0] = True  # every row has at least one valid token
    values = torch.tensor(draw(st.lists(st.floats(-5, 5), min_size=B * T, max_size=B * T))).reshape(B, T)
    rewards = torch.tensor(draw(st.lists(st.floats(-3, 3), min_size=B, max_size=B)))
    return rewards, values, mask


@FAST
@given(gae_batch())
def test_gae_gamma_lambda_one_equals_reward_minus_value(batch):
    rewards, values, mask = batch
    adv, ret = compute_gae(rewards, values, mask)
    expected = torch.where(mask, rewards[:, None] - values, 0.0)
    assert torch.allclose(adv, expected, atol=1e-5)
    assert torch.allclose(ret, torch.where(mask, rewards[:, None].expand_as(values), 0.0), atol=1e-5)


@FAST
@given(gae_batch(), st.floats(0, 1), st.floats(0, 1))
def test_gae_ignores_masked_positions_and_inserted_pads(batch, gamma, lam):
    rewards, values, mask = batch
    adv, ret = compute_gae(rewards, values, mask, gamma, lam)
    garbage = torch.where(mask, values, torch.full_like(values, 1e6))
    adv2, _ = compute_gae(rewards, garbage, mask, gamma, lam)
    assert torch.allclose(adv, adv2)
    assert bool((adv[~mask] == 0).all()) and bool((ret[~mask] == 0).all())
    # compressing each row to its valid tokens gives the same advantages
    for b in range(mask.shape[0]):
        idx = mask[b].nonzero().flatten()
        a_row, _ = compute_gae(rewards[b:b + 1], values[b:b + 1, idx], torch.ones(1, len(idx)), gamma, lam)
        assert torch.allclose(a_row[0], adv[b, idx], atol=1e-5)


def reference_gae(rewards_BT, values_BT, mask_BT, gamma, lam):
    """Textbook recursion, one python step per token, skipping masked positions."""
    adv = torch.zeros_like(values_BT, dtype=torch.float64)
    for b in range(mask_BT.shape[0]):
        next_v = next_a = 0.0
        for t in reversed(range(mask_BT.shape[1])):
            if not mask_BT[b, t]:
                continue
            delta = float(rewards_BT[b, t]) + gamma * next_v - float(values_BT[b, t])
            next_a = delta + gamma * lam * next_a
            next_v = float(values_BT[b, t])
            adv[b, t] = next_a
    return adv


@FAST
@given(gae_batch(), st.floats(0, 1), st.floats(0, 1))
def test_gae_matches_textbook_recursion(batch, gamma, lam):
    rewards, values, mask = batch
    adv, _ = compute_gae(rewards, values, mask, gamma, lam)
    expected = reference_gae(place_terminal_reward(rewards, mask), values, mask, gamma, lam)
    assert torch.allclose(adv.double(), expected, atol=1e-4)


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.3, 0.2), (0.1, 0.1), (1.0, 0.0)])
def test_gae_long_rows_span_several_blocks(gamma, lam):
    torch.manual_seed(1)
    mask = torch.rand(2, 1500) > 0.3
    mask[:, 0] = True
    values, token_rewards = torch.randn(2, 1500), torch.where(mask, torch.randn(2, 1500) * 0.1, 0.0)
    adv, _ = compute_gae(token_rewards, values, mask, gamma, lam)
    assert torch.allclose(adv.double(), reference_gae(token_rewards, values, mask, gamma, lam), atol=1e-4)


# --- GRPO --------------------------------------------------------------------
def test_grpo_walkthrough_example():
    adv = grpo_advantages(torch.tensor([1.0, 1.0] + [0.0] * 14), ["p"] * 16)
    assert adv[:2].tolist() == pytest.approx([0.875, 0.875])
    assert adv[2:].tolist() == pytest.approx([-0.125] * 14)


def test_grpo_two_groups_and_std_norm_hand_computed():
    rewards = torch.tensor([1.0, 3.0, 0.0, 0.0, 5.0])
    adv = grpo_advantages(rewards, torch.tensor([7, 7, 2, 2, 9]))
    assert adv.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0, 0.0])
    # group 7: mean 2, unbiased std sqrt(2); zero-variance group 2 and singleton 9 give 0, not NaN
    adv_std = grpo_advantages(rewards, [7, 7, 2, 2, 9], norm_by_std=True, eps=0.0)
    assert adv_std.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0, 0.0, 0.0])


@FAST
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(-10, 10)), min_size=1, max_size=20),
       st.lists(st.floats(-50, 50), min_size=4, max_size=4), st.booleans())
def test_grpo_shift_invariance_and_zero_group_mean(items, shifts, norm):
    groups = [g for g, _ in items]
    rewards = torch.tensor([r for _, r in items], dtype=torch.float64)
    adv = grpo_advantages(rewards, groups, norm_by_std=norm)
    shifted = rewards + torch.tensor([shifts[g] for g in groups], dtype=torch.float64)
    assert torch.allclose(adv, grpo_advantages(shifted, groups, norm_by_std=norm), atol=1e-6)
    for g in set(groups):
        sel = torch.tensor([x == g for x in groups])
        assert abs(float(adv[sel].sum())) < 1e-6


# --- bad input ---------------------------------------------------------------
def test_gae_shape_mismatch_names_arguments_and_shapes():
    with pytest.raises(InputError) as err:
        compute_gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    assert "values[2, 4]" in str(err.value) and "rewards[2, 3]" in str(err.value)


def test_gae_nan_reward_is_reward_error():
    with pytest.raises(RewardError, match="rewards"):
        compute_gae(torch.tensor([float("nan")]), torch.zeros(1, 2), torch.ones(1, 2))


def test_gae_nan_value_on_valid_token_rejected_but_ok_when_masked():
    with pytest.raises(InputError, match="values"):
        compute_gae(torch.tensor([1.0]), torch.tensor([[0.0, float("nan")]]), torch.ones(1, 2))
    adv, _ = compute_gae(torch.tensor([1.0]), torch.tensor([[0.0, float("nan")]]), torch.tensor([[1, 0]]))
    assert adv.tolist() == [[1.0, 0.0]]


def test_gae_rejects_reward_on_masked_position_row_without_tokens_and_bad_params():
    with pytest.raises(RewardError, match="masked"):
        compute_gae(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2), torch.tensor([[1, 0]]))
    with pytest.raises(InputError, match="no valid token"):
        compute_gae(torch.tensor([1.0]), torch.zeros(1, 2), torch.zeros(1, 2))
    with pytest.raises(InputError, match="gamma"):
        compute_gae(torch.tensor([1.0]), torch.zeros(1, 2), torch.ones(1, 2), gamma=1.5)
    with pytest.raises(InputError, match="0/1"):
        compute_gae(torch.tensor([1.0]), torch.zeros(1, 2), torch.tensor([[1, 2]]))


def test_grpo_bad_input():
    with pytest.raises(InputError, match="empty"):
        grpo_advantages(torch.tensor([]), [])
    with pytest.raises(InputError, match="group_ids has 2 entries but rewards has 3"):
        grpo_advantages(torch.tensor([1.0, 0.0, 1.0]), [0, 0])
    with pytest.raises(RewardError):
        grpo_advantages(torch.tensor([1.0, float("nan")]), [0, 0])
    with pytest.raises(InputError, match="eps"):
        grpo_advantages(torch.tensor([1.0, 0.0]), [0, 0], norm_by_std=True, eps=-1.0)


def test_errors_pickle_and_subclass_builtin():
    with pytest.raises(ValueError) as err:
        grpo_advantages(torch.tensor([1.0, 0.0, 1.0]), [0, 0])
    again = pickle.loads(pickle.dumps(err.value))
    assert isinstance(again, T1OpsError) and str(again) == str(err.value)
