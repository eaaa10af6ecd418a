"""Advantage estimators: GAE over a critic (the T1 report's PPO) and GRPO group-centring
(the SkyRL walkthrough).

Shapes: ``B`` trajectories (chunks), ``T`` token positions. ``mask_BT`` marks
valid positions: the loss-bearing (sampled) tokens the estimator runs over.
Masked positions are skipped by the recursion and get advantage 0 and
return 0, so observation tokens and padding never carry credit.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from rl import _checks
from rl.errors import InputError, RewardError


def place_terminal_reward(rewards_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Put each trajectory's scalar reward on its last valid (response) token.

    The report's dense reward is still placed this way: "the scalar still enters
    at the last response token of each trajectory chunk" (T1 report, section 06).
    A row with no valid token cannot hold a reward: InputError.
    """
    mask_BT = _checks.bool_mask("mask", mask_BT)
    _checks.ndim("mask", mask_BT, 2, "[B, T]")
    rewards_B = _checks.float_tensor("rewards", rewards_B)
    _checks.ndim("rewards", rewards_B, 1, "[B]")
    if rewards_B.shape[0] != mask_BT.shape[0]:
        raise InputError(f"rewards has {rewards_B.shape[0]} entries but mask has {mask_BT.shape[0]} rows "
                         f"(shapes {list(rewards_B.shape)} vs {list(mask_BT.shape)})", argument="rewards")
    empty = ~mask_BT.any(dim=1)
    if bool(empty.any()):
        raise InputError(f"mask rows {empty.nonzero().flatten().tolist()[:5]} have no valid token, so their "
                         "reward has nowhere to go; drop those trajectories or fix the loss mask",
                         argument="mask")
    T = mask_BT.shape[1]
    last_B = T - 1 - torch.flip(mask_BT.to(torch.int8), dims=[1]).argmax(dim=1)
    out_BT = torch.zeros(mask_BT.shape, dtype=rewards_B.dtype)
    out_BT[torch.arange(mask_BT.shape[0]), last_B] = rewards_B
    return out_BT


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over ``[B, T]`` tensors.

    ``rewards`` is ``[B, T]`` (token rewards; the report puts the whole reward on
    the last response token) or ``[B]`` (one scalar per trajectory, placed on its
    last valid token by :func:`place_terminal_reward`). ``values`` is ``[B, T]``:
    the critic's pre-update values (no gradient is kept). ``mask`` is ``[B, T]``.

    The recursion runs over valid positions only: ``delta_t = r_t + gamma *
    V_next - V_t`` where ``V_next`` is the value at the next *valid* position
    (0 after the last), and ``A_t = delta_t + gamma * lam * A_next``. With the
    report's gamma = lambda = 1 (section 04), ``A_t = (sum of rewards from t) - V_t``.

    Returns ``(advantages_BT, returns_BT)`` with ``returns = advantages + values``
    on valid positions and 0 elsewhere.
    """
    gamma = _checks.unit_interval("gamma", gamma)
    lam = _checks.unit_interval("lam", lam)
    mask_BT = _checks.bool_mask("mask", mask)
    _checks.ndim("mask", mask_BT, 2, "[B, T]")
    values_BT = _checks.float_tensor("values", values).detach()
    rewards = _checks.float_tensor("rewards", rewards).detach()
    rewards_BT = place_terminal_reward(rewards, mask_BT) if rewards.dim() == 1 else rewards
    _checks.same_shape(rewards=rewards_BT, values=values_BT, mask=mask_BT)
    _checks.finite("rewards", rewards_BT, where=mask_BT, error=RewardError)
    _checks.finite("values", values_BT, where=mask_BT)
    stray = (rewards_BT != 0) & ~mask_BT
    if bool(stray.any()):
        raise RewardError(f"rewards are non-zero at {int(stray.sum())} masked position(s) "
                          f"(first {stray.nonzero()[:3].tolist()}); a reward on a pad/observation token "
                          "would be dropped. Put it on the last valid response token.", argument="rewards")

    # Skipping masked positions (not zeroing them) keeps credit flowing across observation
    # tokens: move each row's valid positions to the front, run GAE there, scatter back.
    order_BT = torch.argsort((~mask_BT).to(torch.int8), dim=1, stable=True)
    valid_BT = torch.gather(mask_BT, 1, order_BT)
    r_BT = torch.gather(rewards_BT, 1, order_BT).to(torch.float64)
    v_BT = torch.where(valid_BT, torch.gather(values_BT, 1, order_BT).to(torch.float64), 0.0)
    v_next_BT = torch.nn.functional.pad(v_BT[:, 1:], (0, 1))  # 0 after the last valid token
    delta_BT = torch.where(valid_BT, r_BT + gamma * v_next_BT - v_BT, 0.0)
    adv_sorted_BT = _discounted_reverse_cumsum(delta_BT, gamma * lam)
    advantages_BT = torch.zeros(mask_BT.shape, dtype=torch.float64).scatter_(1, order_BT, adv_sorted_BT)
    advantages_BT = torch.where(mask_BT, advantages_BT, 0.0).to(values_BT.dtype)
    returns_BT = torch.where(mask_BT, advantages_BT + values_BT, 0.0)
    return advantages_BT, returns_BT


def _discounted_reverse_cumsum(x_BT: torch.Tensor, c: float) -> torch.Tensor:
    """``out_t = sum_{k >= 0} c^k x_{t+k}`` along dim 1 (float64), without a python loop over T.

    Inside a block ``out_t = c^-t * revcumsum(c^s x_s)_t``; blocks are sized so ``c^L``
    stays above 1e-300 (no underflow) and chained by carrying ``out`` at a block's start.
    """
    if c == 1.0:
        return x_BT.flip(1).cumsum(1).flip(1)
    if c == 0.0:
        return x_BT.clone()
    B, T = x_BT.shape
    L = int(min(4096, max(1, 300 / -math.log10(c))))
    out_BT = torch.empty_like(x_BT)
    carry_B = torch.zeros(B, dtype=x_BT.dtype)  # out at the first position of the next block
    pow_L = c ** torch.arange(L + 1, dtype=x_BT.dtype)
    for start in range((T - 1) // L * L, -1, -L):
        n = min(L, T - start)
        scaled_Bn = (x_BT[:, start:start + n] * pow_L[:n]).flip(1).cumsum(1).flip(1)
        out_Bn = scaled_Bn / pow_L[:n] + carry_B[:, None] * pow_L[1:n + 1].flip(0)
        out_BT[:, start:start + n] = out_Bn
        carry_B = out_Bn[:, 0]
    return out_BT

def _group_index(group_ids: Any, n: int) -> tuple[torch.Tensor, list[Hashable]]:
    """Map arbitrary group ids (ints, strings, tensor) to 0..G-1."""
    ids: Sequence[Hashable] = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(ids) != n:
        raise InputError(f"group_ids has {len(ids)} entries but rewards has {n}; pass one group id per "
                         "trajectory", argument="group_ids", num_group_ids=len(ids), num_rewards=n)
    order: dict[Hashable, int] = {}
    index = [order.setdefault(g, len(order)) for g in ids]
    return torch.tensor(index, dtype=torch.long), list(order)


def grpo_advantages(rewards: torch.Tensor, group_ids: Any, norm_by_std: bool = False,
                    eps: float = 1e-6) -> torch.Tensor:
    """GRPO group-centred advantage per trajectory (``[N]`` rewards -> ``[N]``).

    ``A_i = r_i - mean(r_group)``, divided by ``std(r_group) + eps`` when
    ``norm_by_std`` (unbiased std, as SkyRL's ``torch.std``). A group of one has
    no baseline but itself, so its advantage is 0. Walkthrough section 6: rewards
    ``[1, 1, 0 x 14]`` give 0.875 for the two successes and -0.125 for the rest.
    Broadcast to tokens with ``adv_N[:, None] * mask_NT``.
    """
    rewards_N = _checks.float_tensor("rewards", rewards)
    _checks.ndim("rewards", rewards_N, 1, "[N] (one reward per trajectory)")
    if rewards_N.numel() == 0:
        raise InputError("rewards is empty: GRPO needs at least one group with one trajectory",
                         argument="rewards")
    _checks.finite("rewards", rewards_N, error=RewardError)
    eps = _checks.non_negative("eps", eps)
    index_N, groups = _group_index(group_ids, rewards_N.numel())
    G = len(groups)
    count_G = torch.zeros(G, dtype=rewards_N.dtype).index_add_(0, index_N, torch.ones_like(rewards_N))
    mean_G = torch.zeros(G, dtype=rewards_N.dtype).index_add_(0, index_N, rewards_N) / count_G
    centred_N = rewards_N - mean_G[index_N]
    if not norm_by_std:
        return centred_N
    sq_G = torch.zeros(G, dtype=rewards_N.dtype).index_add_(0, index_N, centred_N ** 2)
    std_N = torch.sqrt(sq_G / (count_G - 1).clamp(min=1))[index_N]
    # a zero-variance group (or a singleton) has no signal: 0, not 0/eps noise or 0/0 = NaN
    return torch.where(std_N > 0, centred_N / (std_N + eps), torch.zeros_like(centred_N))


def grpo_trajectory_advantages(rewards: torch.Tensor, group_ids: Any, trajectory_ids: Any,
                               norm_by_std: bool = False, baseline_only: Sequence[tuple[Hashable, float]] = (),
                               eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages for batch rows that may be chunks of one trajectory (``[B]`` -> ``[B]``).

    A trajectory split by history compaction or a TITO split has several rows; the group
    baseline counts each *trajectory* once (walkthrough section 6: one reward per sample),
    never each chunk. Rows of one trajectory must carry the same reward and group. Every
    chunk gets its trajectory's advantage. ``baseline_only`` lists ``(group_id, reward)``
    of trajectories with no row in the batch (failed trials kept as reward 0 with mask 0,
    or a trajectory whose loss mask was cleared): they enter their group's mean and std.
    """
    rewards_B = _checks.float_tensor("rewards", rewards)
    _checks.ndim("rewards", rewards_B, 1, "[B] (one reward per row)")
    gids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    tids = trajectory_ids.tolist() if isinstance(trajectory_ids, torch.Tensor) else list(trajectory_ids)
    if not (len(gids) == len(tids) == rewards_B.numel()):
        raise InputError(f"rewards ({rewards_B.numel()}), group_ids ({len(gids)}) and trajectory_ids "
                         f"({len(tids)}) need one entry per row", argument="trajectory_ids")
    first: dict[Hashable, int] = {}
    for b, t in enumerate(tids):
        j = first.setdefault(t, b)
        if gids[j] != gids[b] or float(rewards_B[j]) != float(rewards_B[b]):
            raise InputError(f"trajectory {t!r} has rows with different groups or rewards "
                             f"({gids[j]!r}/{float(rewards_B[j])} vs {gids[b]!r}/{float(rewards_B[b])}); "
                             "its chunks share one reward and one group", argument="trajectory_ids")
    rows = list(first.values())
    traj_rewards = [float(rewards_B[b]) for b in rows] + [float(r) for _, r in baseline_only]
    traj_groups = [gids[b] for b in rows] + [g for g, _ in baseline_only]
    adv_T = grpo_advantages(torch.tensor(traj_rewards, dtype=rewards_B.dtype), traj_groups,
                            norm_by_std=norm_by_std, eps=eps)
    index = {t: k for k, t in enumerate(first)}
    return adv_T[torch.tensor([index[t] for t in tids], dtype=torch.long)]


def whiten_advantages(advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Advantages shifted and scaled to mean 0, std 1 over the valid tokens of the whole batch
    (0 at masked positions). PPO advantage whitening: off in the T1 report ("advantage
    normalization is not enabled", section 06); ``trainer.advantage_whitening`` turns it on."""
    mask_BT = _checks.bool_mask("mask", mask)
    adv_BT = _checks.float_tensor("advantages", advantages).detach()
    _checks.same_shape(advantages=adv_BT, mask=mask_BT)
    valid = adv_BT[mask_BT]
    if valid.numel() < 2:
        return torch.where(mask_BT, adv_BT - (valid.mean() if valid.numel() else 0.0), 0.0)
    out = (adv_BT - valid.mean()) / (valid.std() + eps)
    return torch.where(mask_BT, out, 0.0)
