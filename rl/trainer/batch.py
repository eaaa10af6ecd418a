"""The trainer's input: a padded batch of trajectories in the data-contract shape.

One row per trajectory (chunk). Every per-token array of a sample rides
exactly the same transforms (the token pipeline of ``rl.routing``: pad, CP
zig-zag, SP shard; identity layout on a single rank), then right-padding to
the batch length ``T``; the routing row count is asserted per sample before
and after, so row j always describes token j (T1 report, section 05).

Token ids are the model's ids (compact ids when the model runs over a
``CompactVocab``; the campaign maps them). Conventions, position j of a row:
``tokens[j]``; ``loss_mask[j]`` = 1 when token j was sampled by the policy;
``rollout_logprobs[j]`` = the sampler's log-prob of token j (0 elsewhere);
``routing[j]`` = the experts token j was routed to (``num_moe_layers x topk``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np
import torch

from rl import routing as rrouting
from rl.errors import DataContractError, InputError, MissingRoutingError

PAD_TOKEN_ID = 0  # never loss-bearing; the attention is causal so right-padding is invisible


@dataclass
class TrainBatch:
    """A padded batch (B trajectories, T positions). Build it with :meth:`from_sequences`."""

    tokens_BT: torch.Tensor            # int64
    loss_mask_BT: torch.Tensor         # bool
    rollout_logprobs_BT: torch.Tensor  # float32, 0 where loss_mask is 0
    num_tokens_B: torch.Tensor         # int64, unpadded length of each row
    rewards_B: torch.Tensor            # float32, one scalar per trajectory
    group_ids: list[Hashable]          # GRPO group (all samples of one prompt; chunks share it)
    prompt_ids: list[Hashable]         # prompt_mean reduction unit
    routing_BTLK: torch.Tensor | None = None  # int64 expert ids, None when the sampler sent none
    trajectory_ids: list[Hashable] | None = None  # rows of one trajectory (its chunks); None: one row each
    baseline_only: list[tuple[Hashable, float]] | None = None  # (group, reward) of row-less trajectories

    @property
    def num_samples(self) -> int:
        return int(self.tokens_BT.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask_BT.sum())

    @classmethod
    def from_sequences(cls, *, tokens: Sequence[Any], loss_mask: Sequence[Any],
                       rollout_logprobs: Sequence[Any], rewards: Sequence[float],
                       group_ids: Sequence[Hashable], prompt_ids: Sequence[Hashable],
                       routing: Sequence[Any] | None = None,
                       trajectory_ids: Sequence[Hashable] | None = None,
                       baseline_only: Sequence[tuple[Hashable, float]] = ()) -> "TrainBatch":
        """Validate per-sample 1-D arrays (routing: ``(N, L, K)`` per sample) and pad them.

        Raises :class:`DataContractError` naming the sample and the counts when
        lengths differ, a loss-bearing position has no finite log-prob, or
        position 0 carries loss (nothing predicts the first token);
        :class:`MissingRoutingError` when routing is given for some samples only.
        """
        num = len(tokens)
        for name, seq in (("loss_mask", loss_mask), ("rollout_logprobs", rollout_logprobs),
                          ("rewards", rewards), ("group_ids", group_ids), ("prompt_ids", prompt_ids)):
            if len(seq) != num:
                raise InputError(f"{name} has {len(seq)} samples but tokens has {num}", argument=name)
        if num == 0:
            raise InputError("a TrainBatch needs at least one sample", argument="tokens")
        if trajectory_ids is not None and len(trajectory_ids) != num:
            raise InputError(f"trajectory_ids has {len(trajectory_ids)} samples but tokens has {num}",
                             argument="trajectory_ids")
        if routing is not None and len(routing) != num:
            raise InputError(f"routing has {len(routing)} samples but tokens has {num}", argument="routing")
        has_routing = routing is not None
        samples = [_sample(i, tokens[i], loss_mask[i], rollout_logprobs[i],
                           routing[i] if has_routing else None, has_routing) for i in range(num)]
        T = max(arrays[0].shape[0] for arrays, _ in samples)
        rewards_B = torch.as_tensor(np.asarray(rewards, dtype=np.float32))
        if not torch.isfinite(rewards_B).all():
            raise DataContractError(f"rewards hold non-finite values: {rewards_B.tolist()[:8]}",
                                    argument="rewards")
        cols = list(zip(*[[_pad_to(a, T, n) for a in arrays] for arrays, n in samples]))
        return cls(tokens_BT=torch.as_tensor(np.stack(cols[0])).long(),
                   loss_mask_BT=torch.as_tensor(np.stack(cols[1])).bool(),
                   rollout_logprobs_BT=torch.as_tensor(np.stack(cols[2])).float(),
                   num_tokens_B=torch.tensor([n for _, n in samples], dtype=torch.long),
                   rewards_B=rewards_B, group_ids=list(group_ids), prompt_ids=list(prompt_ids),
                   routing_BTLK=torch.as_tensor(np.stack(cols[3])).long() if has_routing else None,
                   trajectory_ids=None if trajectory_ids is None else list(trajectory_ids),
                   baseline_only=[(g, float(r)) for g, r in baseline_only])


def _pipeline(x: np.ndarray, num_tokens: int) -> np.ndarray:
    """The token pipeline for this (single) rank; applied to every per-token array alike."""
    return rrouting.shard_for_rank(x, num_tokens=num_tokens, sp_size=1, cp_size=1, cp_rank=0, sp_rank=0)


def _sample(i: int, tokens: Any, loss_mask: Any, logprobs: Any, rows: Any,
            with_routing: bool) -> tuple[list[np.ndarray], int]:
    tok_N = np.asarray(tokens, dtype=np.int64)
    n = tok_N.shape[0] if tok_N.ndim == 1 else -1
    mask_N = np.asarray(loss_mask).astype(bool)
    lp_N = np.asarray(logprobs, dtype=np.float32)
    if n < 2 or mask_N.shape != (n,) or lp_N.shape != (n,):
        raise DataContractError(f"sample {i}: tokens {tok_N.shape}, loss_mask {mask_N.shape} and "
                                f"rollout_logprobs {lp_N.shape} must be equal-length 1-D arrays of >= 2 tokens",
                                sample=i)
    if mask_N[0]:
        raise DataContractError(f"sample {i}: position 0 carries loss, but nothing predicts the first token; "
                                "the prompt's tokens must have loss_mask 0", sample=i)
    bad = mask_N & ~(np.isfinite(lp_N) & (lp_N <= 0))
    if bad.any():
        raise DataContractError(f"sample {i}: {int(bad.sum())} loss-bearing position(s) (first "
                                f"{int(np.flatnonzero(bad)[0])}) have no finite log-prob <= 0", sample=i)
    out = [tok_N, mask_N, np.where(mask_N, lp_N, 0.0).astype(np.float32)]
    if with_routing:
        if rows is None:
            raise MissingRoutingError(f"sample {i} has no routing while the others do; absent routing "
                                      "aborts the rollout, it is never dropped or guessed", sample=i)
        rows_NLK = np.asarray(rows)
        if rows_NLK.ndim != 3:
            raise DataContractError(f"sample {i}: routing must be (tokens, layers, topk), got {rows_NLK.shape}",
                                    sample=i)
        rrouting.assert_row_count(n, rows_NLK, sample=str(i), stage="trainer input")
        out.append(rows_NLK.astype(np.int64))
    piped = [_pipeline(a, n) for a in out]
    if with_routing:
        rrouting.assert_row_count(piped[0].shape[0], piped[3], sample=str(i), stage="after token pipeline")
    return piped, n


def _pad_to(x: np.ndarray, length: int, num_tokens: int) -> np.ndarray:
    """Right-pad axis 0 to ``length``. Routing rows past the sample's tokens get the
    distinct experts 0..K-1 (a valid top-k set); they sit after every loss-bearing
    token, so under a causal mask they cannot reach any gradient."""
    out = np.zeros((length,) + x.shape[1:], dtype=x.dtype)
    out[:x.shape[0]] = x
    if x.ndim == 3:
        out[num_tokens:] = np.arange(x.shape[2], dtype=x.dtype)
    return out
