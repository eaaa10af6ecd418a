"""The megatron-core MoE model the trainer trains and the embedded engine serves.

API (all tensors on CPU in the embedded setup; ids are COMPACT ids, see rl.vocab):

    spec = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                     num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64,
                     max_seq_len=256, vocab_size=vocab.size)
    policy = build_policy(spec, seed, dtype=torch.float32, unk_id=vocab.unk_id)  # GPTModel
    critic = build_critic(spec, seed)                                            # GPTModel, value head
    logprobs_BT = token_logprobs(policy, ids_BT, targets_BT)  # log p(targets[b,t] | ids[b,:t+1])
    logits_BV   = last_logits(policy, ids_BT)                 # next-token logits at position T-1
    values_BT   = values(critic, ids_BT)
    with record_routing(policy) as rec:                       # rec.rows after the block:
        policy_forward(policy, ids_BT)                        #   list of B arrays int32 [T, L, K]
    with replay_routing(policy, rows):                        # rows: B arrays [T_b <= T, L, K]
        token_logprobs(policy, ids_BT, targets_BT)            # experts from rows, gates live
    save_weights(model, dir)  /  load_weights(model, dir)     # dir/weights.pt (tensors only)
    state = weights_state_dict(model); load_state(model, state)  # for t1ops checkpoints

Model: megatron-core ``GPTModel`` with the local layer spec, every layer MoE,
configured as Qwen3-MoE so that :mod:`rl.hf` maps it exactly onto
``transformers``' ``Qwen3MoeForCausalLM``: RMSNorm (eps 1e-6), grouped-query
attention (``num_query_groups``) with per-head q/k RMSNorm, RoPE (base 1e6,
rotate-half), SwiGLU experts, a softmax top-k router whose top-k weights are
renormalised (megatron: softmax over the top-k logits, the same numbers), no
shared expert, no aux loss, no biases, dropout 0, untied embeddings;
``moe_enable_routing_replay`` on for the policy. Call ``rl.megatron_cpu.init_single_process()`` (done by the builders)
before anything else. Row convention: position t's routing row is what the
layer chose for the token at t when it was fed as input; a trajectory of N
tokens has N-1 rows (the last token is never fed), matching SGLang's
``routed_experts``.

Padding: batches are right-padded; attention is causal, so padded positions
never change earlier positions. The UNK compact id (inputs only) is masked out
of every softmax: log-probs and sampling are over the real compact ids.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from rl.errors import CheckpointError, InputError, RoutingError
from rl.megatron_cpu import init_single_process
from rl.model_parallel import ReplicatedValueHead, apply_head, full_sequence, layer_spec, parallel_sizes

WEIGHTS_FILE = "weights.pt"
_LOGPROB_CHUNK_TOKENS = 4096  # positions per LM-head chunk: bounds B x chunk x V logits ...
_LOGPROB_CHUNK_LOGITS = 1 << 25  # ... and B x chunk x V <= 32 Mi floats (128 MiB) for a full vocabulary
#: Qwen3-MoE constants the tiny model shares with the HF layout (rl.hf.qwen3_moe writes them to config.json).
RMS_NORM_EPS = 1e-6
ROPE_THETA = 1_000_000.0


@dataclass(frozen=True)
class ModelSpec:
    """Model shape; field names match ``t1ops.config.ModelConfig``."""

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: int = 128
    num_experts: int = 8
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int = 64
    max_seq_len: int = 2048
    vocab_size: int = 248_320
    num_query_groups: int = 2

    @classmethod
    def from_config(cls, config) -> "ModelSpec":
        """From any object with the same attribute names (e.g. ModelConfig)."""
        return cls(**{name: getattr(config, name) for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict:
        return asdict(self)


def _transformer_config(spec: ModelSpec, dtype: torch.dtype, routing_replay: bool, sequence_parallel: bool = False):
    from megatron.core.transformer.transformer_config import TransformerConfig

    tp, ep = parallel_sizes()
    if spec.vocab_size % tp:
        raise InputError(f"vocab_size {spec.vocab_size} is not divisible by tp = {tp}: the LM head and embedding "
                         "are split by vocabulary rows; pad the vocabulary to a multiple of tp",
                         vocab_size=spec.vocab_size, tp=tp)
    if dtype not in (torch.float32, torch.bfloat16):
        raise InputError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}", dtype=str(dtype))
    if spec.num_attention_heads % spec.num_query_groups:
        raise InputError(
            f"num_attention_heads ({spec.num_attention_heads}) must be a multiple of num_query_groups "
            f"({spec.num_query_groups}) for grouped-query attention",
            num_attention_heads=spec.num_attention_heads, num_query_groups=spec.num_query_groups,
        )
    if spec.moe_router_topk > spec.num_experts:
        raise InputError(
            f"moe_router_topk ({spec.moe_router_topk}) exceeds num_experts ({spec.num_experts})",
            moe_router_topk=spec.moe_router_topk, num_experts=spec.num_experts,
        )
    return TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups,
        ffn_hidden_size=spec.ffn_hidden_size,
        num_moe_experts=spec.num_experts,
        moe_router_topk=spec.moe_router_topk,
        moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
        moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="none",
        moe_enable_routing_replay=routing_replay,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # Expert MLP biases hit an in-place-on-view autograd error in mcore 0.16's
        # SequentialMLP; MoE models of this family carry no linear biases anyway.
        add_bias_linear=False,
        normalization="RMSNorm",
        layernorm_epsilon=RMS_NORM_EPS,
        qk_layernorm=True,
        gated_linear_unit=True,  # SwiGLU: fc1 = [gate; up], act(gate) * up
        activation_func=torch.nn.functional.silu,
        use_cpu_initialization=not torch.cuda.is_available(),
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        # the trainer's layout (rl.trainer.ranks); all 1 / False in a world of 1
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=1,
    )


def _build_gpt(spec: ModelSpec, seed: int, dtype: torch.dtype, routing_replay: bool,
               sequence_parallel: bool = False):
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if not parallel_state.model_parallel_is_initialized():
        init_single_process()
    config = _transformer_config(spec, dtype, routing_replay, sequence_parallel)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(spec),
        vocab_size=spec.vocab_size,
        max_sequence_length=spec.max_seq_len,
        position_embedding_type="rope",
        rotary_base=ROPE_THETA,
        share_embeddings_and_output_weights=False,
    )
    model.t1_spec = spec
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
    """
    from megatron.core import tensor_parallel

    model = _build_gpt(spec, seed, dtype, routing_replay=False, sequence_parallel=sequence_parallel)
    config = model.config
    if parallel_sizes()[0] == 1:
        model.output_layer = tensor_parallel.ColumnParallelLinear(
            spec.hidden_size, 1, config=config, init_method=config.init_method,
            bias=True, skip_bias_add=False, gather_output=True,
        )
    else:
        model.output_layer = ReplicatedValueHead(spec.hidden_size, config)
    if torch.cuda.is_available():
        model.output_layer.cuda(torch.cuda.current_device())
    with torch.no_grad():
        model.output_layer.bias.zero_()
    model.t1_unk_id = None
    return model


# --- forward helpers -----------------------------------------------------------
def _check_ids(model, ids_BT: torch.Tensor, name: str = "ids_BT") -> None:
    if ids_BT.dim() != 2 or ids_BT.shape[1] == 0:
        raise InputError(f"{name} must be [B, T] with T >= 1, got {tuple(ids_BT.shape)}", shape=tuple(ids_BT.shape))
    spec: ModelSpec = model.t1_spec
    if ids_BT.shape[1] > spec.max_seq_len:
        raise InputError(
            f"{name} has {ids_BT.shape[1]} positions, model max_seq_len is {spec.max_seq_len}",
            num_positions=ids_BT.shape[1], max_seq_len=spec.max_seq_len,
        )
    if ids_BT.numel() and (int(ids_BT.min()) < 0 or int(ids_BT.max()) >= spec.vocab_size):
        raise InputError(f"{name} must lie in [0, {spec.vocab_size}); map ids with CompactVocab first")


def _model_inputs(ids_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_positions = ids_BT.shape[1]
    device = ids_BT.device
    position_ids_BT = torch.arange(num_positions, device=device).unsqueeze(0).expand_as(ids_BT)
    # megatron's default causal mask is built on "cuda"; pass our own (True = masked).
    mask_11TT = torch.triu(torch.ones(num_positions, num_positions, dtype=torch.bool, device=device), 1)
    return ids_BT.long(), position_ids_BT, mask_11TT.view(1, 1, num_positions, num_positions)


def policy_forward(model, ids_BT: torch.Tensor) -> torch.Tensor:
    """Full logits [B, T, V] in the model's dtype (UNK not masked; prefer token_logprobs)."""
    _check_ids(model, ids_BT)
    return model(*_model_inputs(ids_BT))


@contextlib.contextmanager
def _hidden_mode(model) -> Iterator[torch.nn.Module]:
    """Make the GPTModel return final hidden states [B, T, H]; yield its real head.

    GPTModel has no public switch to skip ``output_layer``; swapping it for a
    pass-through for the duration lets callers apply the head to the
    positions they need only (last position, or chunks under checkpointing).
    """
    head = model.output_layer
    model.output_layer = _PassThroughHead()
    try:
        yield head
    finally:
        model.output_layer = head


class _PassThroughHead(torch.nn.Module):
    def forward(self, hidden_SBH, weight=None, runtime_gather_output=None):
        return hidden_SBH, None


def _masked_logits(head, unk_id: int | None, hidden_SBH: torch.Tensor) -> torch.Tensor:
    logits = apply_head(head, hidden_SBH).float()
    if unk_id is not None:
        logits[..., unk_id] = float("-inf")
    return logits


def last_logits(model, ids_BT: torch.Tensor) -> torch.Tensor:
    """fp32 next-token logits [B, V] at the last position, UNK masked to -inf."""
    _check_ids(model, ids_BT)
    with _hidden_mode(model) as head:
        hidden_SBH = full_sequence(model, model(*_model_inputs(ids_BT)).transpose(0, 1))
        return _masked_logits(head, model.t1_unk_id, hidden_SBH[-1:])[0]


def token_logprobs(model, ids_BT: torch.Tensor, targets_BT: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """fp32 log p(targets[b, t] | ids[b, :t+1]) as [B, T], differentiable.

    ``temperature`` divides the logits before the log-softmax, as the sampler
    does (SGLang reports log-probs of the temperature-scaled distribution);
    the trainer passes the sampling temperature so its PPO ratio compares the
    same policy the engine sampled from.

    Memory-aware: the LM head runs over chunks of positions, each under
    activation checkpointing when grad is on, so at most one chunk of
    B x chunk x V logits is alive at a time. Out-of-range targets raise.
    A target equal to UNK (an observation token outside the compact
    vocabulary) cannot be sampled and has no exact log-prob: its entry is 0
    and it must never carry loss (``TrainBatch`` refuses loss on it); prompt
    and observation positions of real trajectories do contain such targets.
    """
    _check_ids(model, ids_BT)
    if targets_BT.shape != ids_BT.shape:
        raise InputError(
            f"targets_BT {tuple(targets_BT.shape)} must match ids_BT {tuple(ids_BT.shape)}",
            targets_shape=tuple(targets_BT.shape), ids_shape=tuple(ids_BT.shape),
        )
    if not temperature > 0:
        raise InputError(f"temperature must be > 0 (greedy sampling reports temperature-1 log-probs), "
                         f"got {temperature!r}", argument="temperature")
    unk_id = model.t1_unk_id
    vocab_size = model.t1_spec.vocab_size
    if int(targets_BT.min()) < 0 or int(targets_BT.max()) >= vocab_size:
        raise InputError(f"targets_BT must be compact ids in [0, {vocab_size}), got range "
                         f"[{int(targets_BT.min())}, {int(targets_BT.max())}]")
    unk_BT = (targets_BT == unk_id) if unk_id is not None else torch.zeros_like(targets_BT, dtype=torch.bool)
    targets_BT = targets_BT.masked_fill(unk_BT, 0)
    with _hidden_mode(model) as head:
        hidden_BTH = model(*_model_inputs(ids_BT))

    def chunk_logprobs(hidden_cBH: torch.Tensor, targets_cB: torch.Tensor) -> torch.Tensor:
        logits_cBV = _masked_logits(head, unk_id, hidden_cBH)
        if temperature != 1.0:
            logits_cBV = logits_cBV / temperature
        picked_cB = logits_cBV.gather(-1, targets_cB.unsqueeze(-1)).squeeze(-1)
        return picked_cB - torch.logsumexp(logits_cBV, dim=-1)

    hidden_TBH = full_sequence(model, hidden_BTH.transpose(0, 1))
    targets_TB = targets_BT.long().transpose(0, 1)
    batch_size = max(1, ids_BT.shape[0])
    chunk = max(1, min(_LOGPROB_CHUNK_TOKENS // batch_size, _LOGPROB_CHUNK_LOGITS // (batch_size * vocab_size)))
    pieces = []
    for start in range(0, hidden_TBH.shape[0], chunk):
        args = (hidden_TBH[start:start + chunk], targets_TB[start:start + chunk])
        if torch.is_grad_enabled():
            pieces.append(checkpoint(chunk_logprobs, *args, use_reentrant=False))
        else:
            pieces.append(chunk_logprobs(*args))
    return torch.cat(pieces, dim=0).transpose(0, 1).masked_fill(unk_BT, 0.0).contiguous()


def values(critic, ids_BT: torch.Tensor) -> torch.Tensor:
    """fp32 value estimates [B, T] (one per position) from ``build_critic``'s model."""
    _check_ids(critic, ids_BT)
    with _hidden_mode(critic) as head:
        hidden_SBH = full_sequence(critic, critic(*_model_inputs(ids_BT)).transpose(0, 1))
        return apply_head(head, hidden_SBH)[..., 0].transpose(0, 1).float()


# --- routing record / replay -------------------------------------------------
def _router_replays(model) -> list:
    replays = [m.router_replay for m in model.modules() if getattr(m, "router_replay", None) is not None]
    if len(replays) != model.t1_spec.num_layers:
        raise RoutingError(
            f"model has {len(replays)} routers with replay, expected {model.t1_spec.num_layers}; "
            "build it with build_policy()",
            num_routers=len(replays),
        )
    return replays


class RoutingRecord:
    """Filled when ``record_routing`` exits: ``rows`` = B arrays int32 [T, L, K]."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.batch_size = 0


@contextlib.contextmanager
def record_routing(model) -> Iterator[RoutingRecord]:
    """Record the top-k experts chosen in the LAST forward inside the block.

    mcore routes flattened [T * B] tokens in sequence-major order, so token
    (b, t) is row t * B + b of each layer's record.
    """
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    replays = _router_replays(model)
    record = RoutingRecord()

    def grab_batch(_module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        record.batch_size = int(ids.shape[0])

    hook = model.register_forward_pre_hook(grab_batch, with_kwargs=True)
    for replay in replays:
        replay.clear_indices()
        replay.set_router_replay_action(RouterReplayAction.RECORD)
    try:
        yield record
        per_layer = [replay.get_recorded_indices() for replay in replays]
        if any(indices is None for indices in per_layer):
            raise RoutingError("record_routing saw no forward pass; run the model inside the block")
        topk_LNK = torch.stack([indices.detach().to("cpu") for indices in per_layer])
        num_layers, num_tokens, topk = topk_LNK.shape
        rows_TBLK = topk_LNK.view(num_layers, num_tokens // record.batch_size, record.batch_size, topk).permute(1, 2, 0, 3)
        record.rows = [rows_TBLK[:, b].numpy().astype(np.int32) for b in range(record.batch_size)]
    finally:
        hook.remove()
        for replay in replays:
            replay.clear_router_replay_action()
            replay.clear_indices()


def _check_rows(rows: Sequence[np.ndarray], spec: ModelSpec) -> list[np.ndarray]:
    checked = []
    for b, rows_TLK in enumerate(rows):
        rows_TLK = np.asarray(rows_TLK)
        if rows_TLK.ndim != 3 or rows_TLK.shape[1:] != (spec.num_layers, spec.moe_router_topk):
            raise RoutingError(
                f"rows[{b}] has shape {rows_TLK.shape}, expected [T, {spec.num_layers}, {spec.moe_router_topk}]",
                sample=b, shape=rows_TLK.shape,
            )
        if rows_TLK.size and (rows_TLK.min() < 0 or rows_TLK.max() >= spec.num_experts):
            raise RoutingError(f"rows[{b}] holds expert ids outside [0, {spec.num_experts})", sample=b)
        sorted_TLK = np.sort(rows_TLK, axis=-1)
        if rows_TLK.size and (np.diff(sorted_TLK, axis=-1) == 0).any():
            raise RoutingError(f"rows[{b}] selects the same expert twice for one token", sample=b)
        checked.append(rows_TLK.astype(np.int64))
    return checked


@contextlib.contextmanager
def replay_routing(model, rows: Sequence[np.ndarray], sp_size: int = 1) -> Iterator[None]:
    """Forwards inside the block use the experts in ``rows`` (R3).

    ``rows[b]`` is int [T_b, L, K] for sample b; every forward inside the
    block must have batch size len(rows) and T >= max T_b. Positions t >= T_b
    (padding) get experts 0..K-1. Gate weights come from the live router
    scores at the replayed experts, so router weights still get gradients.

    Under sequence parallelism (``sp_size`` > 1) the routers of this rank see
    only its slice of the positions: ``rows`` are then this rank's slice (the
    token pipeline's SP split, ``rl.routing.shard_for_rank``) and T counts the
    local positions, ``num_positions / sp_size``.
    """
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    spec: ModelSpec = model.t1_spec
    replays = _router_replays(model)
    checked = _check_rows(rows, spec)

    def set_targets(_module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        batch_size, num_positions = int(ids.shape[0]), int(ids.shape[1])
        if num_positions % sp_size:
            raise RoutingError(f"{num_positions} positions do not split over sp_size = {sp_size}; pad them "
                               "through the token pipeline first")
        num_positions //= sp_size
        if batch_size != len(checked):
            raise RoutingError(f"replay has rows for {len(checked)} samples, forward has {batch_size}")
        targets_TBLK = np.broadcast_to(
            np.arange(spec.moe_router_topk), (num_positions, batch_size, spec.num_layers, spec.moe_router_topk)
        ).copy()
        for b, rows_TLK in enumerate(checked):
            if rows_TLK.shape[0] > num_positions:
                raise RoutingError(
                    f"rows[{b}] has {rows_TLK.shape[0]} positions, forward has only {num_positions}", sample=b
                )
            targets_TBLK[: rows_TLK.shape[0], b] = rows_TLK
        targets = torch.from_numpy(targets_TBLK).to(ids.device)
        for layer, replay in enumerate(replays):
            replay.clear_indices()
            replay.set_target_indices(targets[:, :, layer].reshape(num_positions * batch_size, -1))

    hook = model.register_forward_pre_hook(set_targets, with_kwargs=True)
    for replay in replays:
        replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    try:
        yield
    finally:
        hook.remove()
        for replay in replays:
            replay.clear_router_replay_action()
            replay.clear_indices()


# --- weights -----------------------------------------------------------------
def weights_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's tensors by name: ``state_dict()`` minus megatron's ``_extra_state`` entries.

    megatron modules add ``<name>._extra_state`` (None for the local spec: no
    FP8 metadata) to ``state_dict()``; checkpoints hold tensors only.
    """
    return {name: value for name, value in model.state_dict().items() if isinstance(value, torch.Tensor)}


def load_state(model, state: dict[str, torch.Tensor], source: str = "<state>") -> None:
    """Copy ``state`` (as from ``weights_state_dict``) into ``model``, all or nothing.

    Names and shapes are checked before any copy: ``load_state_dict`` copies
    tensor by tensor, so a late mismatch would leave a half-updated (served)
    model. dtypes are cast to the model's (fp32 checkpoint into a bf16 engine).
    """
    current = model.state_dict()
    expected = weights_state_dict(model)
    wrong = sorted(set(state) ^ set(expected)) or [
        name for name, tensor in state.items()
        if not isinstance(tensor, torch.Tensor) or tensor.shape != expected[name].shape
    ]
    if wrong:
        raise CheckpointError(
            f"{source} does not fit this model: {len(wrong)} tensor(s) differ in name or shape "
            f"(first: {wrong[:3]}); build the model with the checkpoint's ModelSpec",
            path=source, mismatched=wrong[:10],
        )
    extras = {name: value for name, value in current.items() if name not in expected}
    model.load_state_dict({**extras, **state}, strict=True)


def save_weights(model, directory: str | Path) -> Path:
    """Write ``directory/weights.pt`` (``weights_state_dict``) atomically; return its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / WEIGHTS_FILE
    tmp = directory / (WEIGHTS_FILE + ".tmp")
    torch.save(weights_state_dict(model), tmp)
    os.replace(tmp, path)
    return path


def load_weights(model, directory: str | Path) -> None:
    """Load ``directory/weights.pt`` into ``model`` via ``load_state``."""
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(f"no {WEIGHTS_FILE} in {directory}; save_weights() writes it", path=str(path))
    load_state(model, torch.load(path, map_location="cpu", weights_only=True), source=str(path))
