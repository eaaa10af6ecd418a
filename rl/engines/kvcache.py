"""Incremental forward of the megatron-core policy with a per-sequence K/V cache.

megatron-core's inference contexts do not run here: the static context
allocates its cache with ``torch.cuda.current_device()`` and batches only
sequences of one common length; the dynamic context needs CUDA kernels. So
this module owns the cache and re-runs the model's own modules around it
(docs/engine.md):

    embedding -> per layer [input_layernorm -> linear_qkv (megatron's
    get_query_key_value_tensors) -> RoPE at each token's absolute position
    (megatron's apply_rotary_pos_emb) -> attention over cached + new keys ->
    linear_proj -> residual -> the layer's own _forward_mlp (pre-MLP norm,
    MoE router with R3 recording, experts, residual)] -> final_layernorm ->
    output_layer on each sequence's last fed position.

Only the attention is re-implemented, with megatron's arithmetic: scores
scaled by 1/sqrt(head_dim), masked positions filled with -10000, softmax in
fp32 when ``attention_softmax_in_fp32``. Everything else is the model's own
code, so weights loaded into the model are used as they are.

A batch holds B sequences, each feeding ``len(new_ids[b])`` tokens after its
``start`` cached positions (a prefill feeds many, a decode step one); shorter
ones are right-padded. Padded tokens are computed but never written to the
cache nor reported.

The Qwen3.5 hybrid: its gated attention layers cache K/V as above (the output gate and partial RoPE
are megatron's own ``get_query_key_value_tensors(output_gate=True)``, ``_apply_output_gate`` and
``apply_rotary_pos_emb``); its GatedDeltaNet layers keep a recurrent and a convolution state per
sequence instead (:mod:`rl.engines.linear_state`), so ``partial_prefix`` is False: a slot's state can be
extended or copied whole, not cut at a shorter shared prefix.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rl.engines.linear_state import LinearState, gdn_forward
from rl.errors import InputError
from rl.model.forward import masked_logits
from rl.model.routing import router_replays

_MASKED_SCORE = -10000.0  # megatron's attention_mask_func fill value


@dataclass
class ForwardOut:
    """Per sequence: fp32 next-token logits after its last fed token, and its fed tokens' routing rows."""

    logits_BV: torch.Tensor
    rows: list[np.ndarray]  # B arrays int32 [n_b, L, K]


def is_linear(layer) -> bool:
    """A GatedDeltaNet layer (megatron's ``GatedDeltaNet`` as its token mixer)."""
    return hasattr(layer.self_attention, "A_log")


class KVCache:
    """Per layer and slot (``num_slots`` sequences of up to ``max_seq_len`` positions): K/V of an attention
    layer, the states of a GatedDeltaNet layer (``linear``, by layer index)."""

    def __init__(self, model, num_slots: int, max_seq_len: int) -> None:
        cfg = model.config
        heads = cfg.num_attention_heads
        self.groups = cfg.num_query_groups or heads
        self.head_dim = cfg.kv_channels or cfg.hidden_size // heads
        dtype = next(model.parameters()).dtype
        shape = (num_slots, max_seq_len, self.groups, self.head_dim)
        layers = list(model.decoder.layers)
        self.keys = {i: torch.zeros(shape, dtype=dtype) for i, layer in enumerate(layers) if not is_linear(layer)}
        self.values = {i: torch.zeros(shape, dtype=dtype) for i in self.keys}
        self.linear = {i: LinearState(layer.self_attention, num_slots, dtype)
                       for i, layer in enumerate(layers) if is_linear(layer)}
        self.partial_prefix = not self.linear  # a recurrent state cannot be cut at a shorter prefix
        self.num_slots, self.max_seq_len = num_slots, max_seq_len

    @staticmethod
    def bytes_per_slot(model, max_seq_len: int) -> int:
        cfg = model.config
        groups = cfg.num_query_groups or cfg.num_attention_heads
        head_dim = cfg.kv_channels or cfg.hidden_size // cfg.num_attention_heads
        itemsize = next(model.parameters()).element_size()
        layers = list(model.decoder.layers)
        attention = sum(not is_linear(layer) for layer in layers)
        linear = sum(LinearState.bytes_per_slot(layer.self_attention, itemsize) for layer in layers if is_linear(layer))
        return 2 * attention * max_seq_len * groups * head_dim * itemsize + linear

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy ``src``'s first ``length`` positions; with GatedDeltaNet layers only all of them."""
        for i in self.keys:
            self.keys[i][dst, :length] = self.keys[i][src, :length]
            self.values[i][dst, :length] = self.values[i][src, :length]
        for state in self.linear.values():
            state.copy(src, dst)


class CachedForward:
    """The policy's forward over new tokens only, reading and extending a :class:`KVCache`."""

    def __init__(self, model, cache: KVCache) -> None:
        from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

        self.model, self.cache = model, cache
        self.config = model.config
        self.layers = list(model.decoder.layers)
        self.replays = router_replays(model)
        self._rope = apply_rotary_pos_emb
        self._freqs = None  # [max_seq_len, 1, 1, rot_dim], computed on first use
        heads = self.config.num_attention_heads
        self.heads_per_group = heads // cache.groups
        self.scale = 1.0 / float(cache.head_dim) ** 0.5
        self.softmax_fp32 = bool(getattr(self.config, "attention_softmax_in_fp32", True))

    def _rotary(self) -> torch.Tensor:
        if self._freqs is None:
            self._freqs = self.model.rotary_pos_emb(self.cache.max_seq_len)
        return self._freqs

    @torch.no_grad()
    def forward(self, slots: list[int], starts: list[int], new_ids: list[list[int]]) -> ForwardOut:
        """Feed ``new_ids[b]`` at positions ``starts[b]..`` of sequence ``slots[b]``; extend the cache."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        batch = len(slots)
        lengths = [len(ids) for ids in new_ids]
        if batch == 0 or min(lengths) == 0:
            raise InputError("every sequence in a forward needs at least one new token", lengths=lengths)
        if max(s + n for s, n in zip(starts, lengths)) > self.cache.max_seq_len:
            raise InputError(f"a sequence would exceed the cache's {self.cache.max_seq_len} positions")
        width = max(lengths)
        ids_BT = torch.zeros(batch, width, dtype=torch.long)
        for b, ids in enumerate(new_ids):
            ids_BT[b, :len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        offsets_T = torch.arange(width)
        starts_B = torch.as_tensor(starts, dtype=torch.long)
        lengths_B = torch.as_tensor(lengths, dtype=torch.long)
        positions_BT = (starts_B[:, None] + offsets_T[None, :]).clamp(max=self.cache.max_seq_len - 1)
        valid_BT = offsets_T[None, :] < lengths_B[:, None]
        slots_B = torch.as_tensor(slots, dtype=torch.long)
        num_keys = int((starts_B + lengths_B).max())
        # key j is visible to the query at absolute position p iff j <= p (causal over cache + new)
        mask_B1TK = (torch.arange(num_keys)[None, None, :] > positions_BT[:, :, None]).unsqueeze(1)
        freqs_TB1D = self._rotary()[positions_BT.transpose(0, 1)].squeeze(2).squeeze(2).unsqueeze(2)
        write = (slots_B[:, None].expand(batch, width)[valid_BT], positions_BT[valid_BT])

        for replay in self.replays:
            replay.clear_indices()
            replay.set_router_replay_action(RouterReplayAction.RECORD)
        try:
            hidden_TBH = self.model.embedding(input_ids=ids_BT, position_ids=positions_BT)
            for index, layer in enumerate(self.layers):
                if index in self.cache.linear:
                    hidden_TBH = hidden_TBH + gdn_forward(layer.self_attention, self.cache.linear[index],
                                                          layer.input_layernorm(hidden_TBH), slots, starts, lengths)
                else:
                    hidden_TBH = self._attention_block(layer, index, hidden_TBH, freqs_TB1D, mask_B1TK, slots_B,
                                                       num_keys, write, valid_BT)
                hidden_TBH = layer._forward_mlp(hidden_TBH)
            hidden_TBH = self.model.decoder.final_layernorm(hidden_TBH)
            last_1BH = hidden_TBH[lengths_B - 1, torch.arange(batch)].unsqueeze(0)
            logits_BV = masked_logits(self.model.output_layer, self.model.t1_unk_id, last_1BH)[0]
            per_layer = [replay.get_recorded_indices() for replay in self.replays]
        finally:
            for replay in self.replays:
                replay.clear_router_replay_action()
                replay.clear_indices()
        topk_LTBK = torch.stack([idx.detach().view(width, batch, -1) for idx in per_layer])
        rows_BTLK = topk_LTBK.permute(2, 1, 0, 3).to(torch.int32).numpy()
        return ForwardOut(logits_BV, [rows_BTLK[b, :n] for b, n in enumerate(lengths)])

    def _attention_block(self, layer, index: int, hidden_TBH, freqs_TB1D, mask_B1TK, slots_B, num_keys: int,
                         write, valid_BT) -> torch.Tensor:
        attn = layer.self_attention
        gated = bool(self.config.attention_output_gate)
        qkv = attn.get_query_key_value_tensors(layer.input_layernorm(hidden_TBH), None, output_gate=gated)
        query, key, value = qkv[:3]
        query = self._rope(query, freqs_TB1D, config=self.config)
        key = self._rope(key, freqs_TB1D, config=self.config)
        keys, values = self.cache.keys[index], self.cache.values[index]
        keys[write] = key.transpose(0, 1)[valid_BT]
        values[write] = value.transpose(0, 1)[valid_BT]
        context_TBX = self._attend(query, keys[slots_B, :num_keys], values[slots_B, :num_keys], mask_B1TK)
        if gated:  # Qwen3.5's gated attention: context * sigmoid(gate), megatron's own arithmetic
            context_TBX = attn._apply_output_gate(context_TBX, qkv[3])
        out, bias = attn.linear_proj(context_TBX)
        if bias is not None:
            out = out + bias
        return hidden_TBH + out

    def _attend(self, query_TBNd, keys_BKGd, values_BKGd, mask_B1TK) -> torch.Tensor:
        """Masked softmax attention, as megatron's DotProductAttention computes it."""
        width, batch, heads, dim = query_TBNd.shape
        if self.heads_per_group > 1:
            keys_BKGd = keys_BKGd.repeat_interleave(self.heads_per_group, dim=2)
            values_BKGd = values_BKGd.repeat_interleave(self.heads_per_group, dim=2)
        q_BNTd = query_TBNd.permute(1, 2, 0, 3)
        scores_BNTK = torch.matmul(q_BNTd, keys_BKGd.permute(0, 2, 3, 1)) * self.scale
        if self.softmax_fp32:
            scores_BNTK = scores_BNTK.float()
        probs_BNTK = torch.softmax(scores_BNTK.masked_fill(mask_B1TK, _MASKED_SCORE), dim=-1)
        probs_BNTK = probs_BNTK.to(values_BKGd.dtype)
        context_BNTd = torch.matmul(probs_BNTK, values_BKGd.permute(0, 2, 1, 3))
        return context_BNTd.permute(2, 0, 1, 3).reshape(width, batch, heads * dim)
