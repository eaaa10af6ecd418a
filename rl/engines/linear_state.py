"""GatedDeltaNet layers in the embedded engine: a recurrent and a convolution state per request.

Where an attention layer caches K/V for every position, a GatedDeltaNet layer (Qwen3.5's linear
attention, ``megatron.core.ssm.gated_delta_net``) carries two fixed-size states per sequence
(docs/engine.md):

- ``conv``: the last ``K - 1`` inputs of its causal depthwise convolution, ``[C, K-1]``;
- ``rec``: the delta-rule memory, ``[value heads, key dim, value dim]``, fp32.

A forward feeds each sequence's new tokens from its state (zero at position 0) and leaves the state
after them; the layer's own modules (``in_proj``, ``conv1d``'s weight, ``A_log``, ``dt_bias``, the gated
output norm, ``out_proj``) do the arithmetic, and the delta rule is megatron's chunked torch rule for a
prefill and its one-token recurrence for a decode step (transformers' ``torch_recurrent_gated_delta_rule``
arithmetic). A state covers exactly a sequence's cached positions, so prefix reuse keeps working when a
request extends a finished one (the next turn of a trajectory); a shorter shared prefix cannot be cut
out of a recurrent state, so those requests prefill in full (:class:`~rl.engines.kvcache.KVCache`'s
``partial_prefix`` is False for a hybrid model).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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


def _split(gdn, qkvzba_NX: torch.Tensor):
    qk, v, heads = gdn.qk_dim, gdn.v_dim, gdn.num_value_heads
    return torch.split(qkvzba_NX, [2 * qk + v, v, heads, heads], dim=-1)


def _heads(gdn, conv_out_BNC: torch.Tensor):
    """q, k (l2-normalised, repeated to the value heads), v: [B, N, heads, dim]."""
    from megatron.core.ssm import gated_delta_net

    b, n = conv_out_BNC.shape[:2]
    q, k, v = torch.split(conv_out_BNC, [gdn.qk_dim, gdn.qk_dim, gdn.v_dim], dim=-1)
    q = gated_delta_net.l2norm(q.reshape(b, n, -1, gdn.key_head_dim).contiguous())
    k = gated_delta_net.l2norm(k.reshape(b, n, -1, gdn.key_head_dim).contiguous())
    repeat = gdn.num_value_heads // gdn.num_key_heads
    if repeat > 1:
        q, k = q.repeat_interleave(repeat, dim=2), k.repeat_interleave(repeat, dim=2)
    return q, k, v.reshape(b, n, -1, gdn.value_head_dim)


def _recurrent_step(q, k, v, g, beta, state_BHKV):
    """One token of the gated delta rule for B sequences (transformers' torch_recurrent_gated_delta_rule,
    T = 1); returns ([B, 1, H, Dv], the new states)."""
    q, k, v = (x[:, 0].float() for x in (q, k, v))            # [B, H, D]
    q = q / (q.shape[-1] ** 0.5)
    state = state_BHKV * g[:, 0].float().exp()[..., None, None]
    kv_mem = (state * k.unsqueeze(-1)).sum(dim=-2)
    delta = (v - kv_mem) * beta[:, 0].float().unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    out = (state * q.unsqueeze(-1)).sum(dim=-2)               # [B, H, Dv]
    return out.unsqueeze(1), state


def _decode(gdn, state: LinearState, qkvzba_1BX: torch.Tensor, slots: list[int], starts: list[int]) -> torch.Tensor:
    """One new token for each of B sequences, batched: [1, B, H]."""
    batch = qkvzba_1BX.shape[1]
    qkv, z, beta, alpha = _split(gdn, qkvzba_1BX[0])          # [B, ...]
    index = torch.as_tensor(slots, dtype=torch.long)
    fresh = torch.as_tensor([s == 0 for s in starts])[:, None, None]
    prev_BCK = state.conv[index].masked_fill(fresh, 0).to(qkv.dtype)
    window_BCW = torch.cat([prev_BCK, qkv.unsqueeze(-1)], dim=-1)
    state.conv[index] = window_BCW[:, :, 1:].to(state.conv.dtype)
    conv_BC = (window_BCW * gdn.conv1d.weight[:, 0, :]).sum(-1)
    if gdn.conv1d.bias is not None:
        conv_BC = conv_BC + gdn.conv1d.bias
    q, k, v = _heads(gdn, gdn.act_fn(conv_BC).unsqueeze(1))
    g = (-gdn.A_log.exp() * F.softplus(alpha.float() + gdn.dt_bias)).unsqueeze(1)  # [B, 1, heads], fp32
    rec = state.rec[index].masked_fill(fresh[..., None], 0)
    core, final = _recurrent_step(q, k, v, g, beta.sigmoid().unsqueeze(1), rec)
    state.rec[index] = final
    normed = gdn._apply_gated_norm(core.to(qkv.dtype), z.reshape(batch, 1, -1, gdn.value_head_dim))
    y, _ = gdn.out_proj(normed.reshape(1, batch, -1))
    return y


@torch.no_grad()
def gdn_forward(gdn, state: LinearState, x_TBH: torch.Tensor, slots: list[int], starts: list[int],
                lengths: list[int]) -> torch.Tensor:
    """The layer's output ``[T, B, H]`` for each sequence's first ``lengths[b]`` positions (padding: 0)."""
    from megatron.core.ssm.gated_delta_net import torch_chunk_gated_delta_rule

    qkvzba_TBX, _ = gdn.in_proj(x_TBH)
    if max(lengths) == 1:  # a decode step: every sequence feeds one token, batched
        return _decode(gdn, state, qkvzba_TBX, slots, starts)
    out_TBH = torch.zeros_like(x_TBH)
    weight = gdn.conv1d.weight  # [C, 1, K]
    for b, (slot, start, n) in enumerate(zip(slots, starts, lengths)):
        qkv, z, beta, alpha = _split(gdn, qkvzba_TBX[:n, b])
        prev_CK = state.conv[slot] if start else torch.zeros_like(state.conv[slot])
        window_1CW = torch.cat([prev_CK.to(qkv.dtype), qkv.transpose(0, 1)], dim=-1).unsqueeze(0)
        state.conv[slot] = window_1CW[0, :, -prev_CK.shape[-1]:]
        conv_1NC = gdn.act_fn(F.conv1d(window_1CW, weight, gdn.conv1d.bias, groups=weight.shape[0])).transpose(1, 2)
        q, k, v = _heads(gdn, conv_1NC)
        g = (-gdn.A_log.exp() * F.softplus(alpha.float() + gdn.dt_bias)).unsqueeze(0)  # [1, N, heads], fp32
        beta = beta.sigmoid().unsqueeze(0)
        rec = state.rec[slot] if start else torch.zeros_like(state.rec[slot])
        if n == 1:
            core, final = _recurrent_step(q, k, v, g, beta, rec.unsqueeze(0))
        else:
            core, final = torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=rec.unsqueeze(0),
                                                       output_final_state=True)
        state.rec[slot] = final[0]
        normed = gdn._apply_gated_norm(core.to(x_TBH.dtype), z.reshape(1, n, -1, gdn.value_head_dim))
        y, _ = gdn.out_proj(normed.reshape(n, 1, -1))
        out_TBH[:n, b] = y[:, 0]
    return out_TBH
