"""Policy and value losses, loss reductions, and TIS weights.

Every loss returns a per-token ``[B, T]`` tensor (0 at masked positions) and a
stats dict of python floats over the valid tokens; :func:`reduce_loss` turns
the per-token tensor into the scalar that is back-propagated. Inputs at masked
positions are never read: they may hold anything, NaN included (observation
tokens have no log-prob), without leaking into the loss or its gradient.

Report defaults (T1 report, section 04): symmetric clip 0.2, value clip 0.2
anchored to the critic's pre-update values, TIS recorded but not applied.
Walkthrough defaults (SkyRL, section 6.1): DPPO binary-TV with delta 0.15.

Numerics (docs/campaign.md, "PPO numerics"): every importance ratio (PPO,
DPPO, TIS) is ``exp(clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))``.
Without the clamp a log-ratio above ~88.7 overflows fp32 to inf: the loss of
a negative-advantage token is inf and a positive one's gradient is NaN, so
one bad token poisons a whole optimizer step. ``clip_ratio_c`` adds the dual
clip: a negative-advantage token's loss is bounded by ``-clip_ratio_c * A``.
"""
from __future__ import annotations

from typing import Literal

import torch

from rl import _checks
from rl.errors import InputError

ReduceMode = Literal["token_mean", "seq_mean", "prompt_mean"]
REDUCE_MODES: tuple[str, ...] = ("token_mean", "seq_mean", "prompt_mean")
TIS_MODES: tuple[str, ...] = ("off", "token", "sequence")
LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 4.9e8: far past any clip, far below fp32/bf16 overflow (~88.7)


def safe_ratio(log_ratio: torch.Tensor, clamp: float = LOG_RATIO_CLAMP) -> torch.Tensor:
    """``exp(clamp(log_ratio, -clamp, clamp))``: finite value and gradient for any finite input."""
    return torch.exp(torch.clamp(log_ratio, -clamp, clamp))


def approx_kl(ratio_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """KL(behaviour || current) over the loss tokens, by the unbiased non-negative ``k3`` estimator
    ``r - 1 - log r`` with ``r = pi / pi_behaviour`` (Schulman, "Approximating KL divergence")."""
    r = ratio_BT.detach()
    return _masked_mean(r - 1.0 - torch.log(r), mask_BT)


def _prepare(mask: torch.Tensor, **named: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Check shapes and finiteness, broadcast ``[B]`` advantages to ``[B, T]``, zero masked slots."""
    mask_BT = _checks.bool_mask("mask", mask)
    _checks.ndim("mask", mask_BT, 2, "[B, T]")
    out: dict[str, torch.Tensor] = {}
    for name, x in named.items():
        x = _checks.float_tensor(name, x)
        if name == "advantages" and x.dim() == 1 and x.shape[0] == mask_BT.shape[0]:
            x = x[:, None].expand(mask_BT.shape)  # one scalar per trajectory (GRPO)
        out[name] = x
    _checks.same_shape(mask=mask_BT, **out)
    for name, x in out.items():
        _checks.finite(name, x, where=mask_BT)
        # where() before any exp(): a NaN in a masked slot would otherwise poison the gradient
        out[name] = torch.where(mask_BT, x, torch.zeros((), dtype=x.dtype))
    return mask_BT, out


def _masked_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    n = int(mask_BT.sum())
    return float(torch.where(mask_BT, x_BT, 0.0).sum()) / n if n else float("nan")


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                  clip_ratio_c: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate per token: ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``.

    ``r = safe_ratio(logprobs - old_logprobs)``; ``old_logprobs`` is the report's
    training-side recomputation under the behaviour snapshot. ``advantages`` is
    ``[B, T]`` or ``[B]``. ``clip_ratio_c`` (> 1, None = off) is the dual clip:
    where ``A < 0`` the loss is at most ``-clip_ratio_c * A``. Stats:
    ``clip_fraction`` (share of valid tokens where the clipped branch is active),
    ``dual_clip_fraction``, ``ratio_mean``, ``ratio_max``, ``num_tokens``.
    """
    clip_low = _checks.non_negative("clip_low", clip_low)
    clip_high = _checks.non_negative("clip_high", clip_high)
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise InputError(f"clip_ratio_c must be > 1 (dual clip bound on r for A < 0) or None, got {clip_ratio_c!r}",
                         argument="clip_ratio_c")
    mask_BT, t = _prepare(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    ratio_BT = safe_ratio(t["logprobs"] - t["old_logprobs"].detach())
    adv_BT = t["advantages"].detach()
    surr_BT = ratio_BT * adv_BT
    clipped_BT = torch.clamp(ratio_BT, 1.0 - clip_low, 1.0 + clip_high) * adv_BT
    token_loss_BT = -torch.minimum(surr_BT, clipped_BT)
    dual_BT = torch.zeros_like(mask_BT)
    if clip_ratio_c is not None:
        bound_BT = -clip_ratio_c * adv_BT
        dual_BT = (adv_BT < 0) & (token_loss_BT > bound_BT)
        token_loss_BT = torch.where(adv_BT < 0, torch.minimum(token_loss_BT, bound_BT), token_loss_BT)
    loss_BT = torch.where(mask_BT, token_loss_BT, 0.0)
    with torch.no_grad():
        stats = {"clip_fraction": _masked_mean((clipped_BT < surr_BT).float(), mask_BT),
                 "dual_clip_fraction": _masked_mean(dual_BT.float(), mask_BT),
                 "ratio_mean": _masked_mean(ratio_BT, mask_BT),
                 "ratio_max": float(ratio_BT[mask_BT].max()) if mask_BT.any() else float("nan"),
                 "approx_kl": approx_kl(ratio_BT, mask_BT), "num_tokens": float(mask_BT.sum())}
    return loss_BT, stats


def dppo_mask(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, advantages: torch.Tensor,
              delta_low: float = 0.15, delta_high: float = 0.15) -> torch.Tensor:
    """DPPO binary total-variation mask (1 keep, 0 drop), same shape and dtype as ``logprobs``.

    Looks at the probability difference ``dp = exp(logprobs) - exp(behaviour_logprobs)``,
    not the ratio. Positive advantage: drop when ``dp > delta_high``; negative
    advantage: drop when ``-dp > delta_low``. Walkthrough section 6.1: behaviour
    prob 0.20 with A > 0 keeps 0.32 (dp 0.12) and drops 0.38 (dp 0.18).
    ``behaviour_logprobs`` are the per-token rollout log-probs (the policy that
    really sampled each token, which can change mid-trajectory when fully async).
    """
    delta_low = _checks.non_negative("delta_low", delta_low)
    delta_high = _checks.non_negative("delta_high", delta_high)
    lp = _checks.float_tensor("logprobs", logprobs)
    blp = _checks.float_tensor("behaviour_logprobs", behaviour_logprobs)
    adv = _checks.float_tensor("advantages", advantages)
    if adv.dim() == 1 and lp.dim() == 2 and adv.shape[0] == lp.shape[0]:
        adv = adv[:, None].expand(lp.shape)
    _checks.same_shape(logprobs=lp, behaviour_logprobs=blp, advantages=adv)
    with torch.no_grad():
        dp = torch.exp(lp) - torch.exp(blp)
        drop = ((adv > 0) & (dp > delta_high)) | ((adv < 0) & (-dp > delta_low))
        return (~drop).to(lp.dtype)


def dppo_loss(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, delta_low: float = 0.15,
              delta_high: float = 0.15) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO policy loss per token: ``-(r A m)`` with ``r = exp(logprobs - behaviour_logprobs)``
    and ``m`` = :func:`dppo_mask` (SkyRL ``binary_tv``). Stats: ``tv_masked_fraction``,
    ``ratio_mean``, ``num_tokens``."""
    mask_BT, t = _prepare(mask, logprobs=logprobs, behaviour_logprobs=behaviour_logprobs,
                          advantages=advantages)
    keep_BT = dppo_mask(t["logprobs"], t["behaviour_logprobs"], t["advantages"], delta_low, delta_high)
    ratio_BT = safe_ratio(t["logprobs"] - t["behaviour_logprobs"].detach())
    loss_BT = torch.where(mask_BT, -(ratio_BT * t["advantages"].detach() * keep_BT), 0.0)
    with torch.no_grad():
        stats = {"tv_masked_fraction": _masked_mean(1.0 - keep_BT, mask_BT),
                 "ratio_mean": _masked_mean(ratio_BT, mask_BT), "approx_kl": approx_kl(ratio_BT, mask_BT),
                 "num_tokens": float(mask_BT.sum())}
    return loss_BT, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, clip: float = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss per token: ``0.5 * max((v - R)^2, (v_clip - R)^2)`` with
    ``v_clip = old + clamp(v - old, -clip, clip)``, anchored to the critic's
    pre-update values ``old_values`` (T1 report, section 04: value clip 0.2).
    Stats: ``clip_fraction`` (clipped branch active), ``value_mean``, ``num_tokens``."""
    clip = _checks.non_negative("clip", clip)
    mask_BT, t = _prepare(mask, values=values, old_values=old_values, returns=returns)
    v_BT, old_BT, ret_BT = t["values"], t["old_values"].detach(), t["returns"].detach()
    v_clip_BT = old_BT + torch.clamp(v_BT - old_BT, -clip, clip)
    unclipped_BT = (v_BT - ret_BT) ** 2
    clipped_BT = (v_clip_BT - ret_BT) ** 2
    loss_BT = torch.where(mask_BT, 0.5 * torch.maximum(unclipped_BT, clipped_BT), 0.0)
    with torch.no_grad():
        stats = {"clip_fraction": _masked_mean((clipped_BT > unclipped_BT).float(), mask_BT),
                 "value_mean": _masked_mean(v_BT, mask_BT), "num_tokens": float(mask_BT.sum())}
    return loss_BT, stats


def reduction_weights(mask: torch.Tensor, mode: str, prompt_ids=None) -> torch.Tensor:
    """Per-token weights ``[B, T]`` (0 at masked positions, summing to 1) for ``mode``.

    - ``token_mean``: every valid token of the batch weighs the same.
    - ``seq_mean``: every trajectory with at least one valid token weighs the same.
    - ``prompt_mean``: every prompt group weighs the same (``prompt_ids`` is one id
      per row): ``w = 1 / (num_prompts * num_tokens_in_prompt)``, as SkyRL's
      advantage pre-scaling (walkthrough section 7: a prompt with 10,000 tokens
      and one with 100,000 each get total weight 1/2).

    Rows (``seq_mean``) and prompts (``prompt_mean``) with no valid token hold no
    loss and are left out of the count; an all-masked batch is an InputError.
    Compute weights over the WHOLE batch, then slice them per micro-batch and sum
    ``weights * loss``: a per-micro-batch denominator is how reducers go wrong.
    """
    mask_BT = _checks.bool_mask("mask", mask)
    _checks.ndim("mask", mask_BT, 2, "[B, T]")
    if mode not in REDUCE_MODES:
        raise InputError(f"mode must be one of {REDUCE_MODES}, got {mode!r}", argument="mode")
    num_valid = int(mask_BT.sum())
    if num_valid == 0:
        raise InputError(f"mask (shape {list(mask_BT.shape)}) has no valid position; there is nothing to "
                         "reduce. Skip the batch explicitly instead of reducing it.", argument="mask")
    m_BT = mask_BT.to(torch.float32)
    if mode == "token_mean":
        return m_BT / num_valid
    if mode == "seq_mean":
        per_row_B = m_BT.sum(dim=1)
        num_rows = int((per_row_B > 0).sum())
        return m_BT / (per_row_B.clamp(min=1) * num_rows)[:, None]
    if prompt_ids is None:
        raise InputError("mode 'prompt_mean' needs prompt_ids (one prompt id per row of mask)",
                         argument="prompt_ids")
    ids = prompt_ids.tolist() if isinstance(prompt_ids, torch.Tensor) else list(prompt_ids)
    if len(ids) != mask_BT.shape[0]:
        raise InputError(f"prompt_ids has {len(ids)} entries but mask has {mask_BT.shape[0]} rows "
                         f"(mask shape {list(mask_BT.shape)})", argument="prompt_ids")
    order: dict = {}
    index_B = torch.tensor([order.setdefault(p, len(order)) for p in ids], dtype=torch.long)
    tokens_P = torch.zeros(len(order)).index_add_(0, index_B, m_BT.sum(dim=1))
    num_prompts = int((tokens_P > 0).sum())
    return m_BT / (tokens_P.clamp(min=1)[index_B] * num_prompts)[:, None]


def reduce_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str, prompt_ids=None) -> torch.Tensor:
    """Scalar loss: ``sum(weights * loss)`` with :func:`reduction_weights`; masked
    positions are ignored whatever they hold. Keeps the graph of ``loss``."""
    weights_BT = reduction_weights(mask, mode, prompt_ids)
    loss_BT = _checks.float_tensor("loss", loss)
    _checks.same_shape(loss=loss_BT, mask=weights_BT)
    valid_BT = weights_BT > 0
    _checks.finite("loss", loss_BT, where=valid_BT)
    return (torch.where(valid_BT, loss_BT, 0.0) * weights_BT.to(loss_BT.dtype)).sum()


def tis_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                clip: float = 2.0, mode: str = "token") -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights of the trainer's policy against the sampler's, ``[B, T]``
    (0 when masked, no gradient).

    ``mode="token"``: ``min(exp(old - rollout), clip)`` per token.
    ``mode="sequence"``: one weight per row, ``min(exp(sum_t (old - rollout)), clip)``,
    broadcast to its valid tokens. Log-ratios are clamped before ``exp``
    (:func:`safe_ratio`). The T1 report records TIS without applying it
    (section 04); ``trainer.tis_mode`` decides, the stats are logged either way.
    Stats: ``tis_mean``, ``tis_max_raw`` (before truncation), ``tis_clip_fraction``.
    """
    clip = _checks.non_negative("clip", clip)
    if mode not in ("token", "sequence"):
        raise InputError(f"TIS mode must be 'token' or 'sequence', got {mode!r}", argument="mode")
    mask_BT, t = _prepare(mask, old_logprobs=old_logprobs, rollout_logprobs=rollout_logprobs)
    with torch.no_grad():
        log_ratio_BT = t["old_logprobs"] - t["rollout_logprobs"]
        if mode == "sequence":
            log_ratio_BT = log_ratio_BT.sum(dim=1, keepdim=True).expand(mask_BT.shape)
        raw_BT = safe_ratio(log_ratio_BT)
        w_BT = torch.where(mask_BT, torch.clamp(raw_BT, max=clip), 0.0)
        stats = {"tis_mean": _masked_mean(w_BT, mask_BT),
                 "tis_max_raw": float(raw_BT[mask_BT].max()) if mask_BT.any() else float("nan"),
                 "tis_clip_fraction": _masked_mean((raw_BT > clip).float(), mask_BT)}
    return w_BT, stats
