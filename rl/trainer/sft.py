"""Supervised step on given token sequences (the campaign's warm start on solutions)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from rl import model as rmodel
from rl.errors import DataContractError
from rl.trainer.batch import PAD_TOKEN_ID
from rl.trainer.forward import shift_to_tokens
from rl.trainer.optim import clip_and_step


@dataclass
class SftStats:
    loss: float  # mean negative log-likelihood per loss token
    num_tokens: int
    grad_norm: float


def _pad(i: int, tokens: Any, mask: Any, T: int) -> tuple[np.ndarray, np.ndarray]:
    tok_N, mask_N = np.asarray(tokens, dtype=np.int64), np.asarray(mask).astype(bool)
    if tok_N.ndim != 1 or tok_N.shape != mask_N.shape or tok_N.shape[0] < 2 or mask_N[0]:
        raise DataContractError(f"sequence {i}: tokens {tok_N.shape} and loss_mask {mask_N.shape} must be equal "
                                "1-D arrays of >= 2 tokens with no loss on position 0", sample=i)
    out_tok, out_mask = np.full(T, PAD_TOKEN_ID, dtype=np.int64), np.zeros(T, dtype=bool)
    out_tok[:tok_N.shape[0]], out_mask[:mask_N.shape[0]] = tok_N, mask_N
    return out_tok, out_mask


def sft_update(actor, optimizer, tokens: Sequence[Any], loss_mask: Sequence[Any], grad_clip: float) -> SftStats:
    """Token-mean cross-entropy over positions where ``loss_mask`` is 1; one optimizer step."""
    if len(tokens) != len(loss_mask) or not tokens:
        raise DataContractError(f"tokens ({len(tokens)}) and loss_mask ({len(loss_mask)}) must be equal, "
                                "non-empty lists of sequences", argument="tokens")
    T = max(len(t) for t in tokens)
    pairs = [_pad(i, t, m, T) for i, (t, m) in enumerate(zip(tokens, loss_mask))]
    tokens_BT = torch.as_tensor(np.stack([p[0] for p in pairs]))
    mask_BT = torch.as_tensor(np.stack([p[1] for p in pairs]))
    num_tokens = int(mask_BT.sum())
    if num_tokens == 0:
        raise DataContractError("no position carries loss: nothing to learn", argument="loss_mask")
    actor.train()
    logprobs_BT = shift_to_tokens(rmodel.token_logprobs(actor, tokens_BT[:, :-1], tokens_BT[:, 1:]))
    loss = -(logprobs_BT * mask_BT).sum() / num_tokens
    loss.backward()
    grad_norm = clip_and_step(actor, optimizer, grad_clip)
    return SftStats(float(loss.detach()), num_tokens, grad_norm)
