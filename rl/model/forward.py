"""Forward passes: full logits, last-position logits, token log-probs (chunked LM head), values.

Ids are compact ids (:mod:`rl.vocab`); the UNK compact id is masked out of every softmax.
Padding: batches are right-padded; attention is causal, so padded positions never change
earlier positions.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.utils.checkpoint import checkpoint

from rl.errors import InputError
from rl.model.context_parallel import cp_group, zigzag_positions
from rl.model.spec import ModelSpec
from rl.model_parallel import apply_head, full_sequence

_LOGPROB_CHUNK_TOKENS = 4096  # positions per LM-head chunk: bounds B x chunk x V logits ...
_LOGPROB_CHUNK_LOGITS = 1 << 25  # ... and B x chunk x V <= 32 Mi floats (128 MiB) for a full vocabulary


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
    """Ids, positions and the causal mask (True = masked). Under context parallelism ``ids_BT`` is this
    rank's zig-zag slice (rl.trainer.context): its positions are the slice's global ones and the mask is
    local queries x all keys (rl.model.context_parallel)."""
    num_positions = ids_BT.shape[1]
    device = ids_BT.device
    _, cp_size, cp_rank = cp_group()
    if cp_size > 1:
        query_T = zigzag_positions(num_positions, cp_size, cp_rank, device=device)
    else:
        query_T = torch.arange(num_positions, device=device)
    key_T = torch.arange(num_positions * cp_size, device=device)
    position_ids_BT = query_T.unsqueeze(0).expand_as(ids_BT)
    # megatron's default causal mask is built on "cuda"; pass our own (True = masked).
    mask_TK = key_T.unsqueeze(0) > query_T.unsqueeze(1)
    return ids_BT.long(), position_ids_BT, mask_TK.view(1, 1, num_positions, num_positions * cp_size)


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


def masked_logits(head, unk_id: int | None, hidden_SBH: torch.Tensor) -> torch.Tensor:
    logits = apply_head(head, hidden_SBH).float()
    if unk_id is not None:
        logits[..., unk_id] = float("-inf")
    return logits


def last_logits(model, ids_BT: torch.Tensor) -> torch.Tensor:
    """fp32 next-token logits [B, V] at the last position, UNK masked to -inf."""
    _check_ids(model, ids_BT)
    with _hidden_mode(model) as head:
        hidden_SBH = full_sequence(model, model(*_model_inputs(ids_BT)).transpose(0, 1))
        return masked_logits(head, model.t1_unk_id, hidden_SBH[-1:])[0]


def token_logprobs(model, ids_BT: torch.Tensor, targets_BT: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False):
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
        logits_cBV = masked_logits(head, unk_id, hidden_cBH)
        if temperature != 1.0:
            logits_cBV = logits_cBV / temperature
        picked_cB = logits_cBV.gather(-1, targets_cB.unsqueeze(-1)).squeeze(-1)
        logprobs_cB = picked_cB - torch.logsumexp(logits_cBV, dim=-1)
        if not with_entropy:
            return logprobs_cB
        with torch.no_grad():
            entropy_cB = torch.special.entr(torch.softmax(logits_cBV.detach().float(), dim=-1)).sum(-1)
        return logprobs_cB, entropy_cB

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
    if with_entropy:
        ent_BT = torch.cat([p[1] for p in pieces], dim=0).transpose(0, 1).contiguous()
        pieces = [p[0] for p in pieces]
    out_BT = torch.cat(pieces, dim=0).transpose(0, 1).masked_fill(unk_BT, 0.0).contiguous()
    return (out_BT, ent_BT) if with_entropy else out_BT


def values(critic, ids_BT: torch.Tensor) -> torch.Tensor:
    """fp32 value estimates [B, T] (one per position) from ``build_critic``'s model."""
    _check_ids(critic, ids_BT)
    with _hidden_mode(critic) as head:
        hidden_SBH = full_sequence(critic, critic(*_model_inputs(ids_BT)).transpose(0, 1))
        return apply_head(head, hidden_SBH)[..., 0].transpose(0, 1).float()
