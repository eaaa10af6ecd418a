"""Builders of the policy and the critic: megatron-core ``GPTModel`` instances of a :class:`ModelSpec`."""
from __future__ import annotations

import torch

from rl.errors import InputError
from rl.megatron_cpu import init_single_process
from rl.model.context_parallel import enable_on_model as enable_context_parallel
from rl.model.spec import ModelSpec, transformer_config
from rl.model_parallel import ReplicatedValueHead, layer_spec, parallel_sizes, stage_layers


def _build_gpt(spec: ModelSpec, seed: int, dtype: torch.dtype, routing_replay: bool,
               sequence_parallel: bool = False):
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if not parallel_state.model_parallel_is_initialized():
        init_single_process()
    config = transformer_config(spec, dtype, routing_replay, sequence_parallel)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(spec),
        vocab_size=spec.vocab_size,
        max_sequence_length=spec.max_seq_len,
        position_embedding_type="rope",
        rotary_percent=spec.partial_rotary_factor,
        rotary_base=spec.rope_theta,
        share_embeddings_and_output_weights=False,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    )
    model.t1_spec = spec
    model.t1_layers = stage_layers(spec)  # this pipeline stage's (first layer, count): rl.trainer.pipeline
    enable_context_parallel(model)
    if spec.hybrid:
        from rl.model.qwen35 import mark_sections

        mark_sections(model, spec)
    if torch.cuda.is_available():  # megatron puts its own layers there; the torch norms start on the CPU
        model.cuda(torch.cuda.current_device())
    return model


def build_policy(spec: ModelSpec, seed: int, dtype: torch.dtype = torch.float32, unk_id: int | None = None,
                 sequence_parallel: bool = False):
    """Policy: a megatron ``GPTModel`` (MoE, routing replay on) over ``spec.vocab_size`` ids.

    ``unk_id`` is the compact UNK id (``CompactVocab.unk_id``); its logit is
    masked out of every softmax. Same ``seed``, ``spec`` and ``dtype`` give the
    same weights; to serve the trainer's weights at another dtype, build at
    that dtype and ``load_weights`` (the state_dict is cast on load).
    """
    if unk_id is not None and not 0 <= unk_id < spec.vocab_size:
        raise InputError(f"unk_id {unk_id} outside [0, {spec.vocab_size})", unk_id=unk_id)
    model = _build_gpt(spec, seed, dtype, routing_replay=True, sequence_parallel=sequence_parallel)
    model.t1_unk_id = unk_id
    return model


def build_critic(spec: ModelSpec, seed: int, dtype: torch.dtype = torch.float32, sequence_parallel: bool = False):
    """Critic: the same MoE ``GPTModel`` trunk with a scalar value head.

    megatron's ``GPTModel`` ends in ``output_layer``, a ColumnParallelLinear
    hidden -> vocab applied after the final layernorm; with no labels the
    model returns its output [B, T, out]. The critic replaces that layer by
    megatron's own ColumnParallelLinear hidden -> 1 (with bias), so the model
    returns values [B, T, 1]. Routing replay is off: replay instances are
    process-global in mcore and the critic's routing is its own. Under tensor
    parallelism a 1-wide output cannot be split: the head is then replicated
    on every TP rank (:class:`_ReplicatedValueHead`, same parameter names).
    The head starts at zero (weight and bias): a fresh critic predicts 0 at every token.
    """
    from megatron.core import tensor_parallel

    model = _build_gpt(spec, seed, dtype, routing_replay=False, sequence_parallel=sequence_parallel)
    config = model.config
    if not model.post_process:  # a pipeline stage before the last holds no head (rl.trainer.pipeline)
        model.t1_unk_id = None
        return model
    if parallel_sizes()[0] == 1:
        model.output_layer = tensor_parallel.ColumnParallelLinear(
            spec.hidden_size, 1, config=config, init_method=config.init_method,
            bias=True, skip_bias_add=False, gather_output=True,
        )
    else:
        model.output_layer = ReplicatedValueHead(spec.hidden_size, config)
    if torch.cuda.is_available():
        model.output_layer.cuda(torch.cuda.current_device())
    # A fresh critic predicts 0 at every token: its first advantages are the rewards themselves.
    # megatron's random head spread the values by its weight norm, ~0.02 * sqrt(hidden) (0.14 at
    # hidden 64, nearly the tiny campaign's mean reward), and every token's advantage carried that
    # noise until the critic had fit (docs/campaign.md, "Learning evidence").
    with torch.no_grad():
        model.output_layer.weight.zero_()
        model.output_layer.bias.zero_()
    model.t1_unk_id = None
    return model
