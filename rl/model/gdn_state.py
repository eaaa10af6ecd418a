"""A GatedDeltaNet layer run from carried states: the one step the engine and context parallelism share.

megatron's ``GatedDeltaNet.forward`` starts every sequence from zero states. Two callers start from
states another pass left (docs/engine.md, docs/parallelism.md "Context parallelism"):

- the embedded engine (``rl.engines.linear_state``) feeds a sequence's new tokens from the states its
  cached positions left;
- a context-parallel rank (``rl.model.context_parallel``) feeds its contiguous shard from the states
  the previous rank's shard left.

Both hand :func:`run_from_state` the layer's ``in_proj`` output for the new positions and the two
states: ``conv`` (the last ``K - 1`` inputs of the causal depthwise convolution, ``[b, C, K-1]``) and
``rec`` (the fp32 delta-rule memory, ``[b, heads, key dim, value dim]``, or None for zero). The
arithmetic is megatron's (its conv module, ``l2norm``, gate, ``torch_chunk_gated_delta_rule``); one new
position from a state takes the rule's one-token recurrence (transformers'
``torch_recurrent_gated_delta_rule`` arithmetic), as a decode step does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def split_projection(gdn, qkvzba: torch.Tensor):
    """``in_proj``'s output ``[..., X]`` -> (qkv, z, beta, alpha) of this tensor-parallel rank's heads."""
    tp = getattr(gdn, "tp_size", 1)
    qk, v, nh = gdn.qk_dim // tp, gdn.v_dim // tp, gdn.num_value_heads // tp
    return torch.split(qkvzba, [2 * qk + v, v, nh, nh], dim=-1)


def heads(gdn, conv_out_BNC: torch.Tensor):
    """q, k (l2-normalised when the layer does, repeated to the value heads), v: ``[B, N, heads, dim]``."""
    from megatron.core.ssm import gated_delta_net

    tp = getattr(gdn, "tp_size", 1)
    b, n = conv_out_BNC.shape[:2]
    q, k, v = torch.split(conv_out_BNC, [gdn.qk_dim // tp, gdn.qk_dim // tp, gdn.v_dim // tp], dim=-1)
    q = q.reshape(b, n, -1, gdn.key_head_dim)
    k = k.reshape(b, n, -1, gdn.key_head_dim)
    if gdn.use_qk_l2norm:
        q, k = gated_delta_net.l2norm(q.contiguous()), gated_delta_net.l2norm(k.contiguous())
    repeat = gdn.num_value_heads // gdn.num_key_heads
    if repeat > 1:
        q, k = q.repeat_interleave(repeat, dim=2), k.repeat_interleave(repeat, dim=2)
    return q.contiguous(), k.contiguous(), v.reshape(b, n, -1, gdn.value_head_dim).contiguous()


def gates(gdn, beta: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta): the fp32 log-decay ``-exp(A_log) softplus(alpha + dt_bias)`` and ``sigmoid(beta)``."""
    return -gdn.A_log.exp() * F.softplus(alpha.float() + gdn.dt_bias), beta.sigmoid()


def recurrent_step(q, k, v, g, beta, state_BHKV):
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


def run_from_state(gdn, qkv_BNC: torch.Tensor, beta_BNH: torch.Tensor, alpha_BNH: torch.Tensor,
                   conv_BCW: torch.Tensor, rec_BHKV: torch.Tensor | None, *, final_state: bool = True):
    """The layer's core output ``[B, N, heads, Dv]`` for N new positions after the states, the final
    delta-rule state (None unless ``final_state``) and the convolution's new state ``[B, C, K-1]``.

    ``qkv_BNC``, ``beta_BNH``, ``alpha_BNH``: :func:`split_projection`'s pieces of the new positions;
    ``conv_BCW``: the inputs before them (zeros at a sequence's start); ``rec_BHKV``: the rule's state
    (None: zero). The gated norm and ``out_proj`` stay the caller's."""
    from megatron.core.ssm.gated_delta_net import torch_chunk_gated_delta_rule

    n, width = qkv_BNC.shape[1], conv_BCW.shape[-1]
    window = torch.cat([conv_BCW.to(qkv_BNC.dtype), qkv_BNC.transpose(1, 2)], dim=-1)  # [B, C, K-1+N]
    conv = gdn.act_fn(gdn.conv1d(window)[..., width:width + n]).transpose(1, 2)      # megatron's conv module
    q, k, v = heads(gdn, conv)
    g, beta = gates(gdn, beta_BNH.contiguous(), alpha_BNH.contiguous())
    if n == 1 and rec_BHKV is not None:
        core, final = recurrent_step(q, k, v, g, beta, rec_BHKV)
    else:
        core, final = torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=rec_BHKV,
                                                   output_final_state=final_state, use_qk_l2norm_in_kernel=False)
    return core, final if final_state else None, window[..., -width:]
