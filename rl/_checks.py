"""Argument checks shared by the pure-math modules (advantages, losses, metrics).

Each check raises :class:`rl.errors.InputError` naming the argument, the shapes
it saw and what to pass instead, so a caller never gets a silent broadcast or a
NaN that surfaces ten steps later.
"""
from __future__ import annotations

from typing import Any

import torch

from rl.errors import InputError


def float_tensor(name: str, x: Any) -> torch.Tensor:
    """``x`` as a floating tensor (python numbers and lists are converted)."""
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as err:
            raise InputError(f"{name} must be a tensor or a sequence of numbers, got {type(x).__name__}: {err}",
                             argument=name) from err
    if not x.is_floating_point():
        x = x.to(torch.float32)
    return x


def bool_mask(name: str, mask: Any) -> torch.Tensor:
    """``mask`` as a bool tensor; values must be 0/1 (or bool)."""
    m = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(mask)
    if m.dtype != torch.bool:
        bad = (m != 0) & (m != 1)
        if bool(bad.any()):
            raise InputError(f"{name} must hold only 0/1 values; found {m[bad][:5].tolist()} "
                             f"(shape {tuple(m.shape)}). Pass a bool or 0/1 tensor.", argument=name)
        m = m != 0
    return m


def same_shape(**named: torch.Tensor) -> tuple[int, ...]:
    """All tensors have one shape; returns it. The error lists every argument's shape."""
    shapes = {k: tuple(v.shape) for k, v in named.items()}
    if len(set(shapes.values())) > 1:
        listing = ", ".join(f"{k}{list(s)}" for k, s in shapes.items())
        raise InputError(f"shape mismatch: {listing}; these arguments must have the same shape",
                         shapes=shapes)
    return next(iter(shapes.values()))


def ndim(name: str, x: torch.Tensor, expected: int, layout: str) -> None:
    """``x`` has ``expected`` dimensions (``layout`` names them, e.g. "[B, T]")."""
    if x.dim() != expected:
        raise InputError(f"{name} must be {layout}, got shape {list(x.shape)}", argument=name,
                         shape=tuple(x.shape))


def finite(name: str, x: torch.Tensor, where: torch.Tensor | None = None,
           error: type[InputError] | type[Exception] = InputError) -> None:
    """No NaN/inf in ``x`` (only positions where ``where`` is True are checked)."""
    bad = ~torch.isfinite(x)
    if where is not None:
        bad = bad & where
    if bool(bad.any()):
        idx = bad.nonzero()[:3].tolist()
        raise error(f"{name} holds {int(bad.sum())} non-finite value(s) (NaN/inf) at positions {idx} "
                    f"(shape {list(x.shape)}); fix the producer, t1ops does not impute them",
                    argument=name, num_bad=int(bad.sum()))


def non_negative(name: str, value: float) -> float:
    """A finite, >= 0 scalar hyper-parameter."""
    v = float(value)
    if not (v >= 0.0 and v != float("inf")):
        raise InputError(f"{name} must be a finite number >= 0, got {value!r}", argument=name)
    return v


def unit_interval(name: str, value: float) -> float:
    """A scalar hyper-parameter in [0, 1] (discount factors)."""
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise InputError(f"{name} must be in [0, 1], got {value!r}", argument=name)
    return v
