"""Training-health metrics and the one token reducer they all use.

A reducer is defined once here and tested against a direct computation,
because the T1 report's log-prob gap was once aggregated with a group-sum
denominator under micro-batch size 1 and read 163-269 instead of ~0.02
(section 09): "until re-derived with the correct reducer it made mismatch look
catastrophic". The rule: a token metric is (sum over every valid token of the
whole batch) / (number of those tokens), whatever the micro-batch split.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rl import _checks
from rl.errors import InputError, MetricError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "metrics-reducer": ("trainer.gap_reducer",),
}

# A reducer maps per-micro-batch token values and masks to one number.
Reducer = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], float]


@dataclass
class TokenMean:
    """Streaming token mean across micro-batches (and ranks, via :meth:`merge`).

    Keeps the numerator and the denominator separately, in float64, so the split
    into micro-batches cannot change the result.
    """

    total: float = 0.0
    num_tokens: int = 0

    def add(self, values: torch.Tensor, mask: torch.Tensor) -> "TokenMean":
        """Add the valid positions of one micro-batch (any shape; masked slots may hold NaN)."""
        m = _checks.bool_mask("mask", mask)
        v = _checks.float_tensor("values", values)
        _checks.same_shape(values=v, mask=m)
        _checks.finite("values", v, where=m)
        self.total += float(torch.where(m, v, 0.0).sum(dtype=torch.float64))
        self.num_tokens += int(m.sum())
        return self

    def merge(self, other: "TokenMean") -> "TokenMean":
        return TokenMean(self.total + other.total, self.num_tokens + other.num_tokens)

    def value(self) -> float:
        if self.num_tokens == 0:
            raise InputError("token mean over zero valid tokens is undefined; every mask was empty",
                             argument="mask")
        return self.total / self.num_tokens


def _as_list(name: str, x: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    items = [x] if isinstance(x, torch.Tensor) else list(x)
    if not items:
        raise InputError(f"{name} is an empty list of micro-batches", argument=name)
    return items


def token_mean_over(values: torch.Tensor | Sequence[torch.Tensor],
                    masks: torch.Tensor | Sequence[torch.Tensor]) -> float:
    """The project's reducer: one token mean over all micro-batches (a :data:`Reducer`)."""
    vs, ms = _as_list("values", values), _as_list("masks", masks)
    if len(vs) != len(ms):
        raise InputError(f"{len(vs)} value micro-batches but {len(ms)} mask micro-batches", argument="masks")
    acc = TokenMean()
    for v, m in zip(vs, ms):
        acc.add(v, m)
    return acc.value()


def direct_token_mean(values: torch.Tensor | Sequence[torch.Tensor],
                      masks: torch.Tensor | Sequence[torch.Tensor]) -> float:
    """Reference: gather every valid token of the batch into one vector and take its mean."""
    vs, ms = _as_list("values", values), _as_list("masks", masks)
    flat = torch.cat([torch.as_tensor(v, dtype=torch.float64)[_checks.bool_mask("mask", m)].flatten()
                      for v, m in zip(vs, ms, strict=True)])
    if flat.numel() == 0:
        raise InputError("no valid tokens in any micro-batch", argument="masks")
    return float(flat.mean())


def verify_reducer(reducer: Reducer, values: Sequence[torch.Tensor], masks: Sequence[torch.Tensor], *,
                   rtol: float = 1e-6, name: str = "reducer") -> float:
    """Run ``reducer`` and compare it with :func:`direct_token_mean`; return its value.

    Raises MetricError naming the reducer, both numbers and their ratio when they
    differ by more than ``rtol`` (relative). Run it on a micro-batch-size-1 split:
    that is where a per-sample denominator diverges from the token count.
    """
    got = float(reducer(values, masks))
    want = direct_token_mean(values, masks)
    if not math.isclose(got, want, rel_tol=rtol, abs_tol=1e-12):
        ratio = got / want if want else math.inf
        raise MetricError(f"{name} reports {got:.6g} but the direct token mean over the same "
                          f"{len(_as_list('values', values))} micro-batch(es) is {want:.6g} ({ratio:.4g}x); its denominator "
                          "is not the batch's valid-token count. Reduce with rl.metrics.token_mean_over.",
                          reducer=name, reported=got, direct=want, ratio=ratio)
    return got


def logprob_gap(train_logprobs: torch.Tensor | Sequence[torch.Tensor],
                rollout_logprobs: torch.Tensor | Sequence[torch.Tensor],
                mask: torch.Tensor | Sequence[torch.Tensor]) -> float:
    """Mean absolute train-vs-rollout log-prob gap per loss-bearing token of the whole batch.

    Each argument is one ``[B, T]`` tensor or a list of micro-batch tensors
    (lengths may differ between micro-batches). The report's healthy values:
    0.021 before TITO + R3, 0.013 after, in a 0.0110-0.0144 band (section 05).
    """
    trains, rollouts = _as_list("train_logprobs", train_logprobs), _as_list("rollout_logprobs", rollout_logprobs)
    masks = _as_list("mask", mask)
    if not len(trains) == len(rollouts) == len(masks):
        raise InputError(f"micro-batch counts differ: train_logprobs {len(trains)}, rollout_logprobs "
                         f"{len(rollouts)}, mask {len(masks)}", argument="mask")
    acc = TokenMean()
    for tr, ro, m in zip(trains, rollouts, masks):
        tr, ro, m = (_checks.float_tensor("train_logprobs", tr), _checks.float_tensor("rollout_logprobs", ro),
                     _checks.bool_mask("mask", m))
        _checks.same_shape(train_logprobs=tr, rollout_logprobs=ro, mask=m)
        _checks.finite("train_logprobs", tr, where=m)
        _checks.finite("rollout_logprobs", ro, where=m)
        acc.add(torch.where(m, (tr.detach() - ro).abs(), 0.0), m)
    return acc.value()


#: Named reducers the trainer may use for the log-prob gap (``TrainerSettings.gap_reducer``). Production
#: has one; the chaos harness registers the report's group-sum reducer to show the self-check catching it.
REDUCERS: dict[str, Reducer] = {"token_mean": token_mean_over}


def checked_logprob_gap(train_BT: torch.Tensor, rollout_BT: torch.Tensor, mask_BT: torch.Tensor,
                        reducer: str = "token_mean") -> float:
    """The step's log-prob gap through the named reducer, self-checked on this step's data.

    The per-token gaps are split into micro-batches of one sample (where a per-sample
    denominator diverges most) and :func:`verify_reducer` compares the reducer with the
    direct token mean: a wrong reducer raises MetricError on the first step it runs
    (docs/failures.md, metrics-reducer)."""
    if reducer not in REDUCERS:
        raise InputError(f"unknown gap reducer {reducer!r}; known: {sorted(REDUCERS)}", argument="gap_reducer")
    logprob_gap(train_BT, rollout_BT, mask_BT)  # validates shapes, masks and finiteness
    m = mask_BT.bool()
    gaps = torch.where(m, (train_BT.detach() - rollout_BT).abs(), 0.0).to(torch.float64)
    return verify_reducer(REDUCERS[reducer], [g[None] for g in gaps], [r[None] for r in m], name=reducer)


_FP32_EPS = 1.2e-7  # torch.finfo(torch.float32).eps: returns arrive as fp32


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over valid tokens.

    1 for a perfect critic, 0 for one that predicts the batch mean, negative and
    unbounded below when subtracting the values adds variance (the report saw
    -33.6 at cold start, 0.71-0.86 warm; section 05). NaN when the returns have
    no variance (EV is undefined then, not 0 or 1): a variance below
    float32 rounding of the returns' scale counts as none, else equal fp32
    rewards would report EV ~ -1e14.
    """
    m = _checks.bool_mask("mask", mask)
    v, r = _checks.float_tensor("values", values), _checks.float_tensor("returns", returns)
    _checks.same_shape(values=v, returns=r, mask=m)
    _checks.finite("values", v, where=m)
    _checks.finite("returns", r, where=m)
    if int(m.sum()) == 0:
        raise InputError(f"mask (shape {list(m.shape)}) has no valid position", argument="mask")
    v64, r64 = v.detach()[m].to(torch.float64), r.detach()[m].to(torch.float64)
    var_returns = float(r64.var(correction=0))
    scale = float(r64.abs().max())
    if var_returns <= (_FP32_EPS * max(scale, 1e-30)) ** 2:
        return math.nan
    return 1.0 - float((r64 - v64).var(correction=0)) / var_returns
