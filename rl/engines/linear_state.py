"""GatedDeltaNet layers in the embedded engine: a recurrent and a convolution state per request.

Where an attention layer caches K/V for every position, a GatedDeltaNet layer (Qwen3.5's linear
attention, ``megatron.core.ssm.gated_delta_net``) carries two fixed-size states per sequence
(docs/engine.md):

- ``conv``: the last ``K - 1`` inputs of its causal depthwise convolution, ``[C, K-1]``;
- ``rec``: the delta-rule memory, ``[value heads, key dim, value dim]``, fp32.

A forward feeds each sequence's new tokens from its state (zero at position 0) and leaves the state
after them; the layer's own modules (``in_proj``, ``conv1d``'s weight, ``A_log``, ``dt_bias``, the gated
output norm, ``out_proj``) do the arithmetic; a prefill runs ``rl.model.gdn_state.run_from_state`` (the
step context-parallel training ranks share: megatron's chunked torch rule from the carried states) and a
decode step its one-token recurrence, batched (transformers' ``torch_recurrent_gated_delta_rule``
arithmetic). A state covers exactly a sequence's cached positions, so prefix reuse keeps working when a
request extends a finished one (the next turn of a trajectory); a shorter shared prefix cannot be cut
out of a recurrent state, so those requests prefill in full (:class:`~rl.engines.kvcache.KVCache`'s
``partial_prefix`` is False for a hybrid model).
"""
from __future__ import annotations

import torch

from rl.model.gdn_state import gates, heads, recurrent_step, run_from_state, split_projection


class LinearState:
    """The states of one GatedDeltaNet layer for ``num_slots`` sequences."""

    def __init__(self, gdn, num_slots: int, dtype: torch.dtype) -> None:
        conv_dim, kernel = gdn.conv1d.weight.shape[0], gdn.conv1d.weight.shape[-1]
        heads, dk, dv = gdn.num_v_heads_local_tp, gdn.key_head_dim, gdn.value_head_dim
        self.conv = torch.zeros(num_slots, conv_dim, kernel - 1, dtype=dtype)
        self.rec = torch.zeros(num_slots, heads, dk, dv, dtype=torch.float32)

    @staticmethod
    def bytes_per_slot(gdn, dtype_size: int) -> int:
        conv_dim, kernel = gdn.conv1d.weight.shape[0], gdn.conv1d.weight.shape[-1]
        return conv_dim * (kernel - 1) * dtype_size + gdn.num_v_heads_local_tp * gdn.key_head_dim * gdn.value_head_dim * 4

    def copy(self, src: int, dst: int) -> None:
        self.conv[dst] = self.conv[src]
        self.rec[dst] = self.rec[src]


def _decode(gdn, state: LinearState, qkvzba_1BX: torch.Tensor, slots: list[int], starts: list[int]) -> torch.Tensor:
    """One new token for each of B sequences, batched: [1, B, H]."""
    batch = qkvzba_1BX.shape[1]
    qkv, z, beta, alpha = split_projection(gdn, qkvzba_1BX[0])  # [B, ...]
    index = torch.as_tensor(slots, dtype=torch.long)
    fresh = torch.as_tensor([s == 0 for s in starts])[:, None, None]
    prev_BCK = state.conv[index].masked_fill(fresh, 0).to(qkv.dtype)
    window_BCW = torch.cat([prev_BCK, qkv.unsqueeze(-1)], dim=-1)
    state.conv[index] = window_BCW[:, :, 1:].to(state.conv.dtype)
    conv_BC = (window_BCW * gdn.conv1d.weight[:, 0, :]).sum(-1)
    if gdn.conv1d.bias is not None:
        conv_BC = conv_BC + gdn.conv1d.bias
    q, k, v = heads(gdn, gdn.act_fn(conv_BC).unsqueeze(1))
    g, beta = gates(gdn, beta.unsqueeze(1), alpha.unsqueeze(1))  # [B, 1, heads], g fp32
    rec = state.rec[index].masked_fill(fresh[..., None], 0)
    core, final = recurrent_step(q, k, v, g, beta, rec)
    state.rec[index] = final
    normed = gdn._apply_gated_norm(core.to(qkv.dtype), z.reshape(batch, 1, -1, gdn.value_head_dim))
    y, _ = gdn.out_proj(normed.reshape(1, batch, -1))
    return y


@torch.no_grad()
def gdn_forward(gdn, state: LinearState, x_TBH: torch.Tensor, slots: list[int], starts: list[int],
                lengths: list[int]) -> torch.Tensor:
    """The layer's output ``[T, B, H]`` for each sequence's first ``lengths[b]`` positions (padding: 0)."""
    qkvzba_TBX, _ = gdn.in_proj(x_TBH)
    if max(lengths) == 1:  # a decode step: every sequence feeds one token, batched
        return _decode(gdn, state, qkvzba_TBX, slots, starts)
    out_TBH = torch.zeros_like(x_TBH)
    for b, (slot, start, n) in enumerate(zip(slots, starts, lengths)):
        qkv, z, beta, alpha = split_projection(gdn, qkvzba_TBX[:n, b])
        conv = state.conv[slot] if start else torch.zeros_like(state.conv[slot])
        rec = state.rec[slot] if start else torch.zeros_like(state.rec[slot])
        core, final, tail = run_from_state(gdn, qkv[None], beta[None], alpha[None], conv[None], rec[None])
        state.conv[slot], state.rec[slot] = tail[0], final[0]
        normed = gdn._apply_gated_norm(core.to(x_TBH.dtype), z.reshape(1, n, -1, gdn.value_head_dim))
        y, _ = gdn.out_proj(normed.reshape(n, 1, -1))
        out_TBH[:n, b] = y[:, 0]
    return out_TBH
