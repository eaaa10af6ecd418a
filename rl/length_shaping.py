"""Length shaping of test-count rewards: the report's three variants (section 06).

Kept apart from the CTRF reward (rl/rewards.py) because it is the one part that needs torch:
the reward of a trial is computed in every rollout worker, which then never imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from rl import _checks
from rl.errors import InputError, RewardError

ShapingMode = Literal["efficiency_bonus", "additive_penalty", "multiplicative"]
SHAPING_MODES: tuple[str, ...] = ("efficiency_bonus", "additive_penalty", "multiplicative")


@dataclass(frozen=True)
class LengthShaping:
    """Length-shaping parameters (T1 report, section 06; the production run used none).

    - ``free_turns`` 25: the free zone, "above the ~22-turn healthy average".
    - ``power`` 1.0: multiplicative discount ``(free_turns / turns) ** power`` past
      the free zone, so a 5-test solve at 50 turns (0.125) scores below a 4-test
      solve at 22 turns (0.2).
    - ``zero_pass_value`` -0.025 (half a test at S = 20): what zero passes score in
      the free zone, sliding to twice that as the discount goes to 0, so the
      "farming floor" at exactly 0 is gone and every pass still outranks it.
    - ``penalty_per_turn`` 0.0008 and ``max_penalty`` 0.04 (< 1/20, one test's
      worth): the additive variant, sub-dominant by design, which is why it failed
      (turns rose from 22 to 50+).
    - ``bonus`` 0.025: the efficiency bonus for the shortest full solve of a bucket.
    """

    free_turns: float = 25.0
    power: float = 1.0
    zero_pass_value: float = -0.025
    penalty_per_turn: float = 0.0008
    max_penalty: float = 0.04
    bonus: float = 0.025


def _discount(turns: torch.Tensor, p: LengthShaping) -> torch.Tensor:
    return torch.where(turns <= p.free_turns, 1.0, (p.free_turns / turns.clamp(min=1e-9)) ** p.power)


def _efficiency_bonus(reward: torch.Tensor, turns: torch.Tensor, solved: Any, bucket: Any,
                      p: LengthShaping) -> torch.Tensor:
    """Bonus for fully-solved trajectories, by turn rank within their same-test-count bucket."""
    if solved is None or bucket is None:
        raise InputError("mode 'efficiency_bonus' needs solved (fully solved, [N] bool) and bucket "
                         "([N] same-test-count bucket id)", argument="solved" if solved is None else "bucket")
    solved_N = _checks.bool_mask("solved", solved)
    bucket_N = torch.as_tensor(bucket)
    _checks.ndim("reward", reward, 1, "[N] for efficiency_bonus")
    _checks.same_shape(reward=reward, turns=turns, solved=solved_N, bucket=bucket_N)
    same_N_N = (bucket_N[:, None] == bucket_N[None, :]) & solved_N[:, None] & solved_N[None, :]
    n_longer_N = (same_N_N & (turns[None, :] > turns[:, None])).sum(dim=1).to(reward.dtype)
    peers_N = (same_N_N.sum(dim=1) - 1).clamp(min=1).to(reward.dtype)
    return reward + torch.where(solved_N, p.bonus * n_longer_N / peers_N, 0.0)


def shape_length(reward: Any, turns: Any, mode: str, params: LengthShaping = LengthShaping(), *,
                 solved: Any = None, bucket: Any = None) -> torch.Tensor:
    """Apply one of the report's three length-shaping variants to test-count rewards.

    ``reward`` (passed / S) and ``turns`` are same-shape tensors or numbers.
    ``multiplicative`` (the fix): ``reward * discount(turns)`` for passes, a small
    negative value for zero passes. ``additive_penalty`` (failed):
    ``reward - min(max_penalty, penalty_per_turn * turns)``. ``efficiency_bonus``
    (ineffective): needs ``solved`` and ``bucket`` (one per trajectory).
    """
    reward_t = _checks.float_tensor("reward", reward)
    turns_t = _checks.float_tensor("turns", turns)
    _checks.same_shape(reward=reward_t, turns=turns_t)
    _checks.finite("reward", reward_t, error=RewardError)
    _checks.finite("turns", turns_t)
    if bool((turns_t < 0).any()):
        raise InputError(f"turns must be >= 0, got {turns_t[turns_t < 0][:3].tolist()}", argument="turns")
    if mode == "multiplicative":
        if bool((reward_t < 0).any()):
            raise RewardError("multiplicative shaping takes test-count rewards >= 0 (passed / S), got "
                              f"{reward_t[reward_t < 0][:3].tolist()}", argument="reward")
        d = _discount(turns_t, params)
        return torch.where(reward_t > 0, reward_t * d, params.zero_pass_value * (2 - d))
    if mode == "additive_penalty":
        return reward_t - torch.clamp(params.penalty_per_turn * turns_t, max=params.max_penalty)
    if mode == "efficiency_bonus":
        return _efficiency_bonus(reward_t, turns_t, solved, bucket, params)
    raise InputError(f"mode must be one of {SHAPING_MODES}, got {mode!r}", argument="mode")
