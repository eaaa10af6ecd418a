"""The Hugging Face layout of a :class:`~rl.model.ModelSpec`, whatever its architecture.

One entry point per question, dispatched on ``spec.arch`` (or a ``config.json``'s ``model_type``) to
:mod:`rl.hf.qwen3_moe` or :mod:`rl.hf.qwen3_5_moe`:

- :func:`config_dict` / :func:`spec_from_config`: ``config.json`` <-> spec;
- :func:`units`, :func:`hf_shapes`: the conversion units and the expected HF shapes;
- :func:`to_hf` / :func:`from_hf` / :func:`check_shapes`: megatron state <-> HF tensors.
"""
from __future__ import annotations

from types import ModuleType
from typing import Iterable, Mapping

import torch

from rl.errors import CheckpointError
from rl.hf import qwen3_5_moe, qwen3_moe
from rl.hf.units import Unit
from rl.model import ModelSpec

_BY_ARCH: dict[str, ModuleType] = {"qwen3_moe": qwen3_moe, "qwen3_5_moe": qwen3_5_moe}
_BY_MODEL_TYPE: dict[str, ModuleType] = {qwen3_moe.MODEL_TYPE: qwen3_moe,
                                         **{t: qwen3_5_moe for t in qwen3_5_moe.MODEL_TYPES}}
SUPPORTED_MODEL_TYPES = tuple(sorted(_BY_MODEL_TYPE))


def _arch(spec: ModelSpec) -> ModuleType:
    return _BY_ARCH[spec.arch]


def config_dict(spec: ModelSpec, torch_dtype: str = "float32", bos_token_id: int | None = None,
                eos_token_id: int | None = None) -> dict:
    return _arch(spec).config_dict(spec, torch_dtype, bos_token_id=bos_token_id, eos_token_id=eos_token_id)


def spec_from_config(config: Mapping, where: str = "config.json") -> ModelSpec:
    """The spec of a ``config.json``; an architecture t1ops does not build is refused by name."""
    model_type = config.get("model_type")
    if model_type not in _BY_MODEL_TYPE:
        raise CheckpointError(f"{where}: model_type {model_type!r} is not supported; t1ops trains "
                              f"{list(SUPPORTED_MODEL_TYPES)} (architectures {config.get('architectures')})",
                              model_type=model_type)
    return _BY_MODEL_TYPE[model_type].spec_from_config(config, where)


def units(spec: ModelSpec) -> list[Unit]:
    return _arch(spec).units(spec)


def hf_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    return _arch(spec).hf_shapes(spec)


def check_names(state: Mapping[str, torch.Tensor], spec: ModelSpec) -> None:
    """Refuse a state whose tensor names are not this spec's policy (reads the names only)."""
    wrong = sorted(set(state) ^ {u.mcore for u in units(spec)})
    if wrong:
        raise CheckpointError(f"state does not match the {spec.arch} policy of this ModelSpec: {len(wrong)} name(s) "
                              f"differ (first: {wrong[:3]}): a critic, another ModelSpec, or a policy saved before the "
                              "Qwen layout (LayerNorm with biases, no q/k norm), which has no exact Hugging Face "
                              "equivalent", mismatched=wrong[:10])


def to_hf(state: Mapping[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """megatron state (``rl.model.weights_state_dict``) -> Hugging Face checkpoint tensors."""
    check_names(state, spec)
    out: dict[str, torch.Tensor] = {}
    for unit in units(spec):
        out.update(zip(unit.hf, unit.split(state[unit.mcore])))
    return out


def from_hf(hf_state: Mapping[str, torch.Tensor], spec: ModelSpec, *, partial: bool = False) -> dict[str, torch.Tensor]:
    """Hugging Face tensors -> megatron state. ``partial``: convert only the units ``hf_state`` covers.

    A unit given in part (``q_proj`` without ``k_proj``), or a name that belongs to no unit, raises.
    """
    all_units = units(spec)
    known = {name for u in all_units for name in u.hf}
    unknown = sorted(set(hf_state) - known)
    if unknown:
        raise CheckpointError(f"{len(unknown)} tensor name(s) are not part of the {spec.arch} layout of this "
                              f"ModelSpec (first: {unknown[:3]})", unknown=unknown[:10])
    out: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    for unit in all_units:
        present = [name in hf_state for name in unit.hf]
        if all(present):
            out[unit.mcore] = unit.merge(tuple(hf_state[name] for name in unit.hf))
        elif any(present) or not partial:
            missing += [name for name, here in zip(unit.hf, present) if not here]
    if missing:
        raise CheckpointError(f"{len(missing)} Hugging Face tensor(s) missing (first: {missing[:3]}); a weight "
                              "update must carry every tensor of a unit", missing=missing[:10])
    return out


def check_shapes(hf_state: Mapping[str, torch.Tensor], spec: ModelSpec, names: Iterable[str] | None = None) -> None:
    """Raise CheckpointError naming every tensor whose shape differs from ``spec``'s layout."""
    expected = hf_shapes(spec)
    wrong = [f"{n}: {tuple(hf_state[n].shape)} != {expected.get(n)}" for n in (names or hf_state)
             if n in hf_state and tuple(hf_state[n].shape) != expected.get(n)]
    if wrong:
        raise CheckpointError(f"{len(wrong)} tensor(s) have the wrong shape for this ModelSpec (first: {wrong[:3]})",
                              mismatched=wrong[:10])
