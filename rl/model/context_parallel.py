"""Context parallelism (CP) on CPU ranks: attention and GatedDeltaNet over a zig-zag sequence split.

docs/parallelism.md, "Context parallelism". With ``cp`` ranks each rank holds two of ``2 x cp`` equal
chunks of every (padded) sample, chunks ``r`` and ``2cp-1-r`` (the zig-zag of ``rl.routing``, which
balances causal attention work). Every per-token module (embedding, norms, MLP/MoE, heads) runs on the
local tokens unchanged; three pieces see the whole sequence:

- positions: :class:`ZigzagRotary` computes RoPE for the full length and keeps this rank's rows, and
  :func:`zigzag_positions` gives the causal mask (local queries x all keys, ``rl.model.forward``);
- attention (:class:`CPDotProductAttention`): K and V are all-gathered over the CP group and put back
  in sequence order (backward: the gradient summed over CP, this rank's rows kept), then megatron's
  local ``DotProductAttention`` runs with the zig-zag causal mask. On GPU the library's CP attention
  (Transformer Engine) is the path; megatron's local attention refuses CP > 1;
- GatedDeltaNet (:class:`CPGatedDeltaNet`), the report's contribution: the recurrence needs contiguous
  tokens, so after ``in_proj`` the zig-zag chunks are relaid to contiguous shards (rank r: chunks 2r,
  2r+1; :func:`relayout`), each rank runs the causal conv and the chunked delta rule from the state the
  previous rank passed on (the last ``K - 1`` conv inputs and the ``[heads, dk, dv]`` fp32 memory), sends
  its own final states to the next rank, and relays its output back to the zig-zag layout before
  ``out_proj``. Backward passes the states' gradients the other way (:class:`_SendNext`,
  :class:`_RecvPrev`). megatron-core 0.16.1 has no CP GatedDeltaNet (its ``TransformerConfig`` refuses
  one): the model's config keeps ``context_parallel_size`` 1 and these modules read the CP group from
  megatron's parallel state (``rl.megatron_cpu.init_model_parallel(cp=)``).

A rank's contiguous shard must be a multiple of the delta rule's 64-token chunk for its arithmetic to
be the single rank's exactly (the chunks then line up); any other length is the same recurrence with
other float rounding. The CP path runs megatron's torch chunked rule and ``conv1d`` on any device (FLA's
kernels with an initial state are the GPU's faster path, not wired here).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from rl.routing import zigzag_chunks

#: A padded length is a multiple of ``cp x CP_ALIGN``: each rank's contiguous GatedDeltaNet shard is then
#: whole 64-token chunks of the delta rule, which rounds as on one rank (:func:`cp_gdn_forward`).
CP_ALIGN = 64


def padded_length(num_positions: int, cp_size: int, align: int = CP_ALIGN) -> int:
    """``num_positions`` rounded up to a multiple of ``cp_size * align`` (unchanged when cp = 1)."""
    if cp_size == 1:
        return num_positions
    multiple = cp_size * align
    return -(-num_positions // multiple) * multiple


GDN_CHUNK = 64  # megatron's torch_chunk_gated_delta_rule chunk_size
_TAG_CONV, _TAG_REC = 11, 12


def cp_group():
    """``(group, size, rank)`` of megatron's context-parallel group; ``(None, 1, 0)`` without one."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None, 1, 0
    size = parallel_state.get_context_parallel_world_size()
    if size == 1:
        return None, 1, 0
    return parallel_state.get_context_parallel_group(), size, parallel_state.get_context_parallel_rank()


def zigzag_positions(num_local: int, cp_size: int, cp_rank: int, device=None) -> torch.Tensor:
    """Global positions of a rank's ``num_local`` zig-zag positions (chunks r and 2cp-1-r)."""
    if num_local % 2:
        raise ValueError(f"a zig-zag slice has two equal chunks; {num_local} positions is odd")
    c = num_local // 2
    a, b = zigzag_chunks(cp_size, cp_rank)
    return torch.cat([torch.arange(a * c, (a + 1) * c, device=device), torch.arange(b * c, (b + 1) * c, device=device)])


def _ranks(group) -> list[int]:
    return dist.get_process_group_ranks(group)


# --- K/V over the CP group ------------------------------------------------------------------
class _GatherSequence(torch.autograd.Function):
    """``[s_local, ...]`` zig-zag -> ``[s_local * cp, ...]`` in sequence order; backward: summed, own rows."""

    @staticmethod
    def forward(ctx, x, group, size, rank):
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.group, ctx.size, ctx.rank, ctx.n = group, size, rank, x.shape[0]
        return _unzigzag(parts, size)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[zigzag_positions(ctx.n, ctx.size, ctx.rank)], None, None, None


def _unzigzag(parts: list[torch.Tensor], size: int) -> torch.Tensor:
    c = parts[0].shape[0] // 2
    chunks: list = [None] * (2 * size)
    for r, p in enumerate(parts):
        a, b = zigzag_chunks(size, r)
        chunks[a], chunks[b] = p[:c], p[c:]
    return torch.cat(chunks, dim=0)


def _dot_product_attention():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    return DotProductAttention


class CPDotProductAttention:
    """megatron's local ``DotProductAttention`` over the whole sequence's K/V (module built per layer)."""

    def __new__(cls, config, *args, **kwargs):
        base = _dot_product_attention()

        class _CP(base):
            def forward(self, query, key, value, attention_mask, *rest, **kw):
                group, size, rank = cp_group()
                if group is not None:
                    key = _GatherSequence.apply(key, group, size, rank)
                    value = _GatherSequence.apply(value, group, size, rank)
                return super().forward(query, key, value, attention_mask, *rest, **kw)

        return _CP(config, *args, **kwargs)


class ZigzagRotary(torch.nn.Module):
    """RoPE of the full sequence, this rank's zig-zag rows (``[s, 1, 1, dim]`` like megatron's)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        inner.cp_group = None  # megatron's own CP slice allocates on CUDA and assumes config CP

    def get_rotary_seq_len(self, *args, **kwargs):
        return self.inner.get_rotary_seq_len(*args, **kwargs)

    def forward(self, max_seq_len: int, *args, **kwargs):
        _, size, rank = cp_group()
        emb = self.inner(max_seq_len * size, *args, **kwargs)
        if size == 1:
            return emb
        return emb[zigzag_positions(max_seq_len, size, rank, device=emb.device)]


# --- relayout: zig-zag chunks <-> contiguous shards ------------------------------------------
def _owners(size: int, contiguous: bool) -> dict[int, tuple[int, int]]:
    """chunk -> (rank, slot) in the zig-zag or the contiguous layout."""
    out = {}
    for r in range(size):
        chunks = (2 * r, 2 * r + 1) if contiguous else zigzag_chunks(size, r)
        for slot, k in enumerate(chunks):
            out[k] = (r, slot)
    return out


def _move(x: torch.Tensor, group, size: int, rank: int, to_contiguous: bool) -> torch.Tensor:
    src, dst = _owners(size, not to_contiguous), _owners(size, to_contiguous)
    ranks = _ranks(group)
    c = x.shape[0] // 2
    mine = [x[:c], x[c:]]
    out = [None, None]
    work = []
    for k in range(2 * size):
        (s_rank, s_slot), (d_rank, d_slot) = src[k], dst[k]
        if s_rank == rank and d_rank == rank:
            out[d_slot] = mine[s_slot]
        elif s_rank == rank:
            work.append(dist.isend(mine[s_slot].contiguous(), ranks[d_rank], group=group, tag=100 + k))
        elif d_rank == rank:
            out[d_slot] = torch.empty_like(mine[0])
            work.append(dist.irecv(out[d_slot], ranks[s_rank], group=group, tag=100 + k))
    for w in work:
        w.wait()
    return torch.cat(out, dim=0)


class _Relayout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, size, rank, to_contiguous):
        ctx.args = (group, size, rank, to_contiguous)
        return _move(x, group, size, rank, to_contiguous)

    @staticmethod
    def backward(ctx, grad):
        group, size, rank, to_contiguous = ctx.args
        return _move(grad.contiguous(), group, size, rank, not to_contiguous), None, None, None, None


def relayout(x_S: torch.Tensor, group, size: int, rank: int, to_contiguous: bool) -> torch.Tensor:
    """Axis 0 between this rank's zig-zag chunks and its contiguous shard (chunks 2r, 2r+1)."""
    return _Relayout.apply(x_S, group, size, rank, to_contiguous)


# --- state passing ---------------------------------------------------------------------------
class _RecvPrev(torch.autograd.Function):
    """The previous rank's state; backward sends its gradient back. ``anchor`` ties it to the graph."""

    @staticmethod
    def forward(ctx, anchor, shape, dtype, peer, group, tag):
        ctx.peer, ctx.group, ctx.tag = peer, group, tag
        out = torch.empty(shape, dtype=dtype)
        dist.recv(out, peer, group=group, tag=tag)
        return out

    @staticmethod
    def backward(ctx, grad):
        dist.send(grad.contiguous(), ctx.peer, group=ctx.group, tag=ctx.tag)
        return None, None, None, None, None, None


class _SendNext(torch.autograd.Function):
    """Sends ``state`` on; returns a 0-d zero to add to the layer's output, whose backward receives the
    state's gradient from the next rank."""

    @staticmethod
    def forward(ctx, state, peer, group, tag):
        ctx.peer, ctx.group, ctx.tag, ctx.shape, ctx.dtype = peer, group, tag, state.shape, state.dtype
        dist.send(state.detach().contiguous(), peer, group=group, tag=tag)
        return torch.zeros((), dtype=state.dtype)

    @staticmethod
    def backward(ctx, _grad):
        grad = torch.empty(ctx.shape, dtype=ctx.dtype)
        dist.recv(grad, ctx.peer, group=ctx.group, tag=ctx.tag)
        return grad, None, None, None


def _gated_delta_net():
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet

    return GatedDeltaNet


class CPGatedDeltaNet:
    """megatron's ``GatedDeltaNet`` whose forward, under CP > 1, is :func:`cp_gdn_forward`."""

    def __new__(cls, config, *args, **kwargs):
        base = _gated_delta_net()

        class _CP(base):
            def forward(self, hidden_states, attention_mask, *rest, **kw):
                group, size, rank = cp_group()
                if group is None:
                    return super().forward(hidden_states, attention_mask, *rest, **kw)
                return cp_gdn_forward(self, hidden_states, group, size, rank)

        return _CP(config, *args, **kwargs)


def cp_gdn_forward(gdn, hidden_states: torch.Tensor, group, size: int, rank: int):
    """megatron's GatedDeltaNet forward (training, no packing) on this rank's zig-zag tokens, ``[s, b, h]``.

    Between the two relayouts, the rank's contiguous shard runs from the previous rank's states
    (``rl.model.gdn_state.run_from_state``, the engine's step too) and sends its own on."""
    from rl.model.gdn_state import run_from_state, split_projection

    ranks = _ranks(group)
    qkvzba, _ = gdn.in_proj(hidden_states)                       # [s, b, x]: the whole local sequence under SP
    qkvzba = relayout(qkvzba, group, size, rank, to_contiguous=True)
    seq_len, batch = qkvzba.shape[:2]
    qkv, gate, beta, alpha = split_projection(gdn, qkvzba.transpose(0, 1))
    width = gdn.conv1d.weight.shape[-1] - 1
    channels = qkv.shape[-1]
    prev, initial = torch.zeros(batch, channels, width, dtype=qkv.dtype), None
    if rank > 0:  # the previous rank's last conv inputs, then its delta-rule memory (the order it sends them)
        prev = _RecvPrev.apply(qkv, (batch, channels, width), qkv.dtype, ranks[rank - 1], group, _TAG_CONV)
        shape = (batch, gdn.num_value_heads // gdn.tp_size, gdn.key_head_dim, gdn.value_head_dim)
        initial = _RecvPrev.apply(qkv, shape, torch.float32, ranks[rank - 1], group, _TAG_REC)
    core, final, conv_tail = run_from_state(gdn, qkv, beta, alpha, prev, initial, final_state=rank < size - 1)
    dummies = []
    if rank < size - 1:
        dummies.append(_SendNext.apply(conv_tail, ranks[rank + 1], group, _TAG_CONV))
        dummies.append(_SendNext.apply(final, ranks[rank + 1], group, _TAG_REC))

    norm_out = gdn._apply_gated_norm(core, gate.reshape(batch, seq_len, -1, gdn.value_head_dim).contiguous())
    norm_out = norm_out.reshape(batch, seq_len, -1).transpose(0, 1).contiguous()
    for d in dummies:  # exactly 0.0: the graph reaches the sends' backward, the values stay the same
        norm_out = norm_out + d.to(norm_out.dtype)
    norm_out = relayout(norm_out, group, size, rank, to_contiguous=False)
    return gdn.out_proj(norm_out)


# --- the model ---------------------------------------------------------------------------------
def cp_layer_specs(layer_specs: list) -> list:
    """The layer specs with CP attention and CP GatedDeltaNet modules (used when CP > 1)."""
    import copy

    out = []
    for layer in layer_specs:
        layer = copy.deepcopy(layer)
        attn = layer.submodules.self_attention
        if attn.module is _gated_delta_net():
            attn.module = CPGatedDeltaNet
        else:
            attn.submodules.core_attention = CPDotProductAttention
        out.append(layer)
    return out


def enable_on_model(model) -> None:
    """After the build, under CP > 1: RoPE of the full sequence sliced to this rank's rows."""
    if cp_group()[1] > 1 and getattr(model, "rotary_pos_emb", None) is not None \
            and not isinstance(model.rotary_pos_emb, ZigzagRotary):
        model.rotary_pos_emb = ZigzagRotary(model.rotary_pos_emb)
