"""An in-process sampler: generate, then score with routing recorded (tests, chaos, benches).

A campaign samples through inference engines (``rl.engines``); this module
plays the engine's part inside one process so the trainer can be exercised
alone: a policy (possibly at another precision, e.g. a bf16 copy of the fp32
actor, as SGLang differs from Megatron) samples responses, then one
teacher-forced forward of each full sequence under ``record_routing`` yields
the rollout log-probs and the routing rows, exactly what an engine returns
(rows for positions 0..N-2; the last token's row is a placeholder that no
gradient can reach, via ``rl.routing.fill_missing_rows``).
"""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np
import torch

from rl import model as rmodel
from rl.errors import InputError
from rl.routing import fill_missing_rows
from rl.trainer.batch import PAD_TOKEN_ID, TrainBatch


@torch.no_grad()
def sample_responses(policy, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                     temperature: float = 1.0, generator: torch.Generator | None = None) -> list[np.ndarray]:
    """Prompt + ``max_new_tokens`` sampled ids per prompt (prompts of equal length; no stop token)."""
    lengths = {len(p) for p in prompts}
    if len(lengths) != 1 or max_new_tokens < 1 or temperature <= 0:
        raise InputError(f"prompts must share one length (got {sorted(lengths)}), max_new_tokens >= 1 "
                         f"(got {max_new_tokens}) and temperature > 0 (got {temperature})", argument="prompts")
    ids_BT = torch.as_tensor(np.asarray(prompts, dtype=np.int64))
    policy.eval()
    for _ in range(max_new_tokens):
        probs_BV = torch.softmax(rmodel.last_logits(policy, ids_BT) / temperature, dim=-1)
        next_B1 = torch.multinomial(probs_BV, 1, generator=generator)
        ids_BT = torch.cat([ids_BT, next_B1], dim=1)
    return [row.numpy() for row in ids_BT]


@torch.no_grad()
def score_with_routing(sampler, sequences: Sequence[np.ndarray], loss_masks: Sequence[np.ndarray],
                       temperature: float = 1.0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(rollout log-probs ``[N]`` at ``temperature``, routing rows ``[N, L, K]``) per sequence
    under ``sampler``."""
    T = max(len(s) for s in sequences)
    ids_BT = torch.full((len(sequences), T), PAD_TOKEN_ID, dtype=torch.long)
    for b, seq in enumerate(sequences):
        ids_BT[b, :len(seq)] = torch.as_tensor(seq)
    sampler.eval()
    with rmodel.record_routing(sampler) as record:
        lp_BT1 = rmodel.token_logprobs(sampler, ids_BT[:, :-1], ids_BT[:, 1:], temperature)
    logprobs, rows = [], []
    for b, seq in enumerate(sequences):
        n = len(seq)
        mask_N = np.asarray(loss_masks[b]).astype(bool)
        lp_N = np.zeros(n, dtype=np.float32)
        lp_N[1:] = lp_BT1[b, :n - 1].numpy()
        rows_NLK = np.zeros((n,) + record.rows[b].shape[1:], dtype=np.int32)
        rows_NLK[:n - 1] = record.rows[b][:n - 1]
        has_N = np.arange(n) < n - 1
        fill_missing_rows(rows_NLK, has_N, mask_N, sample=str(b))
        logprobs.append(np.where(mask_N, lp_N, 0.0).astype(np.float32))
        rows.append(rows_NLK)
    return logprobs, rows


def rollout_batch(sampler, sequences: Sequence[np.ndarray], prompt_lens: Sequence[int], rewards: Sequence[float],
                  group_ids: Sequence[Hashable], prompt_ids: Sequence[Hashable],
                  temperature: float = 1.0) -> TrainBatch:
    """A :class:`TrainBatch` whose response tokens (after each prompt) carry loss, scored by
    ``sampler`` at the sampling ``temperature``."""
    masks = [np.arange(len(s)) >= p for s, p in zip(sequences, prompt_lens)]
    logprobs, rows = score_with_routing(sampler, sequences, masks, temperature)
    return TrainBatch.from_sequences(tokens=list(sequences), loss_mask=masks, rollout_logprobs=logprobs,
                                     rewards=rewards, group_ids=group_ids, prompt_ids=prompt_ids, routing=rows)
