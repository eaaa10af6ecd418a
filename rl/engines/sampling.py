"""Token sampling shared by the engine's decode paths, and one request's output so far."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from rl.engines import protocol as P


@dataclass
class Generation:
    """What one /generate request has produced so far."""

    output_compact: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)  # one [L, K] row per fed position
    versions: list[str] = field(default_factory=list)     # one per output token
    finish: P.FinishReason | None = None


def sample_token(logits_V: torch.Tensor, params: P.SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """Sample one compact id; return it and its log-prob under the temperature-scaled distribution.

    ``logits_V`` is fp32 with the UNK logit already -inf. Greedy when
    temperature == 0 (log-prob of the unscaled distribution, as SGLang reports).
    """
    temperature = params.temperature if params.temperature > 0 else 1.0
    logprobs_V = torch.log_softmax(logits_V / temperature, dim=-1)
    if params.temperature == 0 or params.top_k == 1:
        token = int(torch.argmax(logprobs_V))
        return token, float(logprobs_V[token])
    candidates_V = logprobs_V.clone()
    if params.top_k > 1:
        kth = torch.topk(candidates_V, min(params.top_k, candidates_V.numel())).values[-1]
        candidates_V[candidates_V < kth] = float("-inf")
    if params.top_p < 1.0:
        sorted_V, order_V = torch.sort(candidates_V, descending=True)
        cumulative_V = torch.cumsum(sorted_V.exp(), dim=-1)
        drop_V = cumulative_V - sorted_V.exp() >= params.top_p  # keep the smallest prefix reaching top_p
        candidates_V[order_V[drop_V]] = float("-inf")
    token = int(torch.multinomial(torch.softmax(candidates_V, dim=-1), 1, generator=generator))
    return token, float(logprobs_V[token])


def finish_reason(full_id: int, num_output: int, params: P.SamplingParams) -> P.FinishReason | None:
    """Stop on a stop token (SGLang's ignore_eos skips EOS only, never stop_token_ids), else on length."""
    if full_id in params.stop_token_ids:
        return P.FinishReason(type="stop", matched=full_id)
    if num_output >= params.max_new_tokens:
        return P.FinishReason(type="length", length=params.max_new_tokens)
    return None
