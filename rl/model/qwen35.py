"""The Qwen3.5-MoE layers on megatron-core's local (no Transformer Engine) spec (docs/model.md).

megatron-core 0.16.1 has every piece of the hybrid but two, which live here:

- :class:`ZeroCentredNorm`: Qwen3.5's RMSNorm stores ``w`` and applies ``1 + w`` (fp32 arithmetic,
  as ``transformers``' ``Qwen3_5MoeRMSNorm``); megatron's ``layernorm_zero_centered_gamma`` exists
  only in Transformer Engine's fused norms. Used for the layer norms, the q/k norms and the final norm.
- :class:`GatedOutNorm`: GatedDeltaNet's output norm (plain ``w``, initialised to ones), built where
  megatron's TE spec builds a TE norm; megatron's ``GatedDeltaNet`` applies the ``silu(z)`` gate.

GatedDeltaNet's ``in_proj`` is a plain ``ColumnParallelLinear`` after the layer's own
``input_layernorm`` (the TE spec fuses the two; ``LocalSpecProvider`` has no fused norm + linear),
the same arithmetic. On a host without CUDA, FLA's Triton ``l2norm`` cannot run, so
:func:`apply_cpu_l2norm` puts the torch twin of FLA's formula in its place (the deterministic
torch gated delta rule is selected by ``TransformerConfig.deterministic_mode``, rl.model.spec).

Tensor parallelism: ``in_proj`` (``[q; k; v; z; b; a]``), ``conv1d`` (``[q; k; v]``) and the shared
expert's SwiGLU ``linear_fc1`` (``[gate; up]``) are split per section, not as one block: TP rank r holds
``[q_r; k_r; ...]``. :func:`mark_sections` records the
sections on the parameters, where :mod:`rl.trainer.shard` reads them.
"""
from __future__ import annotations

import copy

import torch

from rl.errors import InputError

_L2NORM_EPS = 1e-6  # FLA's l2norm default, and transformers' use_qk_l2norm_in_kernel


class _RMSNorm(torch.nn.Module):
    """``x / rms(x)`` in fp32 and a weight: the two ways Qwen3.5 applies it are the subclasses."""

    def __init__(self, hidden_size: int, eps: float, init: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.full((hidden_size,), init))

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)


class _ZeroCentredRMSNorm(_RMSNorm):
    """``x / rms(x) * (1 + w)`` in fp32, cast back: ``transformers``' ``Qwen3_5MoeRMSNorm``."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__(hidden_size, eps, init=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.normed(x) * (1.0 + self.weight.float())).type_as(x)


class _GatedOutNorm(_RMSNorm):
    """``w * (x / rms(x))`` with the product in the input dtype: ``Qwen3_5MoeRMSNormGated`` before its gate."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__(hidden_size, eps, init=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * self.normed(x).to(x.dtype)


class ZeroCentredNorm:
    """Megatron builds norms as ``norm(config=, hidden_size=, eps=)`` (a class: ``build_module`` returns a
    plain function unbuilt); parameters marked like megatron's fused norms under sequence parallelism
    (the trainer sums their gradients over TP)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-6, **_unused) -> torch.nn.Module:
        norm = _ZeroCentredRMSNorm(hidden_size, eps).to(config.params_dtype)
        norm.weight.sequence_parallel = bool(config.sequence_parallel)
        return norm


class GatedOutNorm:
    """Shared by every value head, and each TP rank holds its own heads: its gradient is partial per
    TP rank (``rl.trainer.grads`` sums ``out_norm`` over TP, as it does the q/k norms)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-6, **_unused) -> torch.nn.Module:
        return _GatedOutNorm(hidden_size, eps).to(config.params_dtype)


def _torch_l2norm(x: torch.Tensor, dim: int = -1, eps: float = _L2NORM_EPS, **_unused) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def apply_cpu_l2norm() -> None:
    """Without CUDA, FLA's Triton ``l2norm`` has no device to run on; use its torch twin (same formula)."""
    if torch.cuda.is_available():
        return
    from megatron.core.ssm import gated_delta_net

    gated_delta_net.l2norm = _torch_l2norm


def layer_specs(spec) -> list:
    """One megatron ``TransformerLayer`` spec per layer of a ``qwen3_5_moe`` :class:`~rl.model.ModelSpec`."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.spec_utils import ModuleSpec

    try:
        from megatron.core.ssm.gated_delta_net import HAVE_FLA, GatedDeltaNet, GatedDeltaNetSubmodules
    except ImportError as exc:  # pragma: no cover - the dependency is declared in pyproject.toml
        raise InputError(f"GatedDeltaNet needs megatron-core's ssm package: {exc}") from exc
    if not HAVE_FLA:
        raise InputError("megatron-core's GatedDeltaNet needs flash-linear-attention importable "
                         "(pip install flash-linear-attention fla-core triton; pyproject.toml pins them)")
    apply_cpu_l2norm()

    def base():
        layer = get_gpt_layer_local_spec(num_experts=spec.num_experts, qk_layernorm=True, normalization="RMSNorm")
        layer = copy.deepcopy(layer)
        layer.submodules.input_layernorm = ZeroCentredNorm
        layer.submodules.pre_mlp_layernorm = ZeroCentredNorm
        return layer

    attention = base()
    attention.submodules.self_attention.submodules.q_layernorm = ZeroCentredNorm
    attention.submodules.self_attention.submodules.k_layernorm = ZeroCentredNorm
    linear = base()
    linear.submodules.self_attention = ModuleSpec(
        module=GatedDeltaNet,
        submodules=GatedDeltaNetSubmodules(in_proj=ColumnParallelLinear, out_norm=GatedOutNorm,
                                           out_proj=RowParallelLinear))
    return [linear if spec.is_linear(i) else attention for i in range(spec.num_layers)]


def mark_sections(model, spec) -> None:
    """Record on each GatedDeltaNet parameter how its full tensor splits over TP (rl.trainer.shard)."""
    qk = spec.linear_key_head_dim * spec.linear_num_key_heads
    v = spec.linear_value_head_dim * spec.linear_num_value_heads
    heads = spec.linear_num_value_heads
    for layer in model.decoder.layers:
        shared = getattr(layer.mlp, "shared_experts", None)
        if shared is not None:  # a TP-split SwiGLU: rank r holds [gate_r; up_r]
            size = spec.shared_expert_intermediate_size
            shared.linear_fc1.weight.t1_sections = (size, size)
        gdn = layer.self_attention
        if not hasattr(gdn, "A_log"):
            continue
        gdn.in_proj.weight.t1_sections = (qk, qk, v, v, heads, heads)
        gdn.conv1d.weight.t1_sections = (qk, qk, v)
        for p in (gdn.conv1d.weight, gdn.A_log, gdn.dt_bias):
            p.partition_dim = 0
