"""Tensor/sequence-parallel pieces of ``rl.model`` (docs/parallelism.md).

- :func:`parallel_sizes`: (tp, ep) of megatron's parallel state (1, 1 in a world of 1);
- :func:`stage_layers`: the layers of this pipeline stage (rl.trainer.pipeline);
- :func:`layer_spec`: megatron's local layer spec with ``SequenceParallelNorm`` as every norm, this
  stage's layers, the context-parallel modules under CP (rl.model.context_parallel);
- :class:`ReplicatedValueHead`: the critic's 1-wide head, whole on every TP rank;
- :func:`full_sequence` and :func:`apply_head`: the LM/value head over the whole sequence when the
  decoder's output is split by sequence parallelism and the LM head by vocabulary rows.
"""
from __future__ import annotations

import torch

from rl.megatron_cpu import SequenceParallelNorm


def parallel_sizes() -> tuple[int, int]:
    """(tp, ep) of megatron's parallel state (1, 1 in a world of 1)."""
    from megatron.core import parallel_state

    return (parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size())


def stage_layers(spec) -> tuple[int, int]:
    """(first layer, number of layers) of this pipeline stage; (0, num_layers) without pipelining."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0, spec.num_layers
    pp, rank = parallel_state.get_pipeline_model_parallel_world_size(), parallel_state.get_pipeline_model_parallel_rank()
    if spec.num_layers % pp:
        from rl.errors import InputError

        raise InputError(f"pp = {pp} must divide num_layers = {spec.num_layers}: each stage holds whole layers, "
                         "as many as the others", pp=pp, num_layers=spec.num_layers)
    count = spec.num_layers // pp
    return rank * count, count


def layer_spec(spec):
    """megatron's local layer spec with :class:`SequenceParallelNorm` as every norm (same params);
    the Qwen3.5 hybrid's per-layer specs and zero-centred norms come from :mod:`rl.model.qwen35`."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from rl.model.context_parallel import cp_group, cp_layer_specs

    first, count = stage_layers(spec)

    def stage_specs(specs: list) -> list:  # this pipeline stage's layers; CP modules under CP
        specs = list(specs)[first:first + count]
        return cp_layer_specs(specs) if cp_group()[1] > 1 else specs
    if spec.hybrid:
        from rl.model import qwen35  # imports flash-linear-attention (and Triton): only for this architecture

        return TransformerBlockSubmodules(layer_specs=stage_specs(qwen35.layer_specs(spec)),
                                          layer_norm=qwen35.ZeroCentredNorm)

    layer = get_gpt_layer_local_spec(num_experts=spec.num_experts, qk_layernorm=True, normalization="RMSNorm")
    layer.submodules.input_layernorm = SequenceParallelNorm
    layer.submodules.pre_mlp_layernorm = SequenceParallelNorm
    attention = layer.submodules.self_attention.submodules
    attention.q_layernorm = attention.k_layernorm = SequenceParallelNorm
    return TransformerBlockSubmodules(layer_specs=stage_specs([layer] * spec.num_layers), layer_norm=SequenceParallelNorm)


class ReplicatedValueHead(torch.nn.Module):
    """hidden -> 1 linear held whole on every tensor-parallel rank (``weight`` [1, H], ``bias`` [1])."""

    def __init__(self, hidden_size: int, config) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(1, hidden_size, dtype=config.params_dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=config.params_dtype))
        config.init_method(self.weight)

    def forward(self, hidden_SBH, weight=None, runtime_gather_output=None):
        return torch.nn.functional.linear(hidden_SBH, self.weight, self.bias), None


def full_sequence(model, hidden_SBH: torch.Tensor) -> torch.Tensor:
    """Under sequence parallelism the decoder's output is this rank's slice of the sequence;
    gather it (backward: keep this rank's slice of the full gradient). Identity otherwise."""
    if not model.config.sequence_parallel:
        return hidden_SBH
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    return gather_from_sequence_parallel_region(hidden_SBH, tensor_parallel_output_grad=False)


def apply_head(head, hidden_SBH: torch.Tensor) -> torch.Tensor:
    """The head over full-sequence hidden states; a vocab-split head's logits are gathered whole.

    For a column-parallel head under TP: copy-to-TP (backward all-reduces the
    input gradient over the vocab shards), the local shard's matmul, gather
    along the vocabulary (backward keeps this rank's shard). With tp = 1 or a
    replicated head this is the head's own forward.
    """
    from megatron.core import tensor_parallel

    if isinstance(head, tensor_parallel.ColumnParallelLinear) and parallel_sizes()[0] > 1:
        x = tensor_parallel.copy_to_tensor_model_parallel_region(hidden_SBH)
        local = torch.nn.functional.linear(x, head.weight, head.bias)
        return tensor_parallel.gather_from_tensor_model_parallel_region(local)
    out, _ = head(hidden_SBH)
    return out
