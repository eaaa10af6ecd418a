"""Routed-expert rows (R3): SGLang codec, stitching, and the token pipeline's transforms.

A routing row is ``num_moe_layers x topk`` int32 expert ids for one token; a
sample's rows form an array ``rows_NLK`` with row j describing token j.

SGLang (``--enable-return-routed-experts``) returns ``meta_info.routed_experts``
as base64 of little-endian int32 covering positions
``[routed_experts_start_len, seqlen - 1)``: no row for the last generated
token, which was sampled but never fed forward.

Rows must ride *exactly* the transforms the tokens ride (T1 report, section
05: "any other composition would misalign rows and silently replay wrong
experts"), so the transforms here are written once over axis 0 of any array
and applied to tokens and rows alike: padding, sequence-parallel split,
context-parallel zig-zag (2 x CP chunks; rank r gets chunks r and 2CP-1-r),
and their inverses. :func:`assert_row_count` is the per-sample check.

Absent routing is :class:`MissingRoutingError`: the rollout aborts, because
dropping the sample would condition the batch on "capture succeeded".
"""
from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pybase64  # SIMD base64: ~10x the standard library's decode (bench/bench_routing.py)

from rl.errors import InputError, MissingRoutingError, RoutingError

_LE_INT32 = np.dtype("<i4")


# --- codec --------------------------------------------------------------------
def encode_routed_experts(rows_NLK: np.ndarray) -> str:
    """Base64 of the rows as little-endian int32 (what SGLang puts in meta_info)."""
    arr = np.asarray(rows_NLK)
    if arr.ndim != 3:
        raise RoutingError(f"rows_NLK must be 3-D (tokens, layers, topk), got shape {arr.shape}",
                           shape=arr.shape)
    return pybase64.b64encode(np.ascontiguousarray(arr, dtype=_LE_INT32)).decode("ascii")


def expected_num_rows(seqlen: int, start_len: int) -> int:
    """Rows SGLang returns for a sequence of ``seqlen`` ids: positions [start_len, seqlen - 1)."""
    if not 0 <= start_len <= max(seqlen - 1, 0):
        raise RoutingError(f"routed_experts_start_len={start_len} outside [0, seqlen-1={seqlen - 1}]",
                           seqlen=seqlen, start_len=start_len)
    return max(seqlen - 1 - start_len, 0)


def decode_routed_experts(b64: str | None, num_layers: int, topk: int,
                          num_tokens: int | None = None, *, num_experts: int | None = None,
                          sample: str = "?", turn: int = -1) -> np.ndarray:
    """Decode ``meta_info.routed_experts`` into int32 rows of shape (N, num_layers, topk).

    ``num_tokens``: the row count the caller expects (see :func:`expected_num_rows`);
    ``num_experts``: if given, every id must lie in [0, num_experts).
    ``None``/empty input for an expected non-zero count -> MissingRoutingError.
    Errors name ``sample``, ``turn`` and the counts. The result is read-only
    (a view of the decoded bytes); copy it to modify.
    """
    where = f"sample {sample} turn {turn}"
    if num_layers <= 0 or topk <= 0:
        raise InputError(f"num_layers={num_layers} and topk={topk} must be positive", where=where)
    if b64 is None or (b64 == "" and num_tokens not in (0, None)):
        raise MissingRoutingError(
            f"{where}: the engine returned no routed_experts (expected {num_tokens} rows); "
            "the rollout aborts rather than dropping the sample. Check that the engine runs with "
            "--enable-return-routed-experts and the request sets return_routed_experts",
            sample=sample, turn=turn, expected_rows=num_tokens)
    if not isinstance(b64, str):
        raise RoutingError(f"{where}: routed_experts must be a base64 string, got {type(b64).__name__}",
                           sample=sample, turn=turn)
    try:
        raw = pybase64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RoutingError(f"{where}: routed_experts is not valid base64 ({exc})",
                           sample=sample, turn=turn) from None
    row_bytes = 4 * num_layers * topk
    if len(raw) % row_bytes:
        raise RoutingError(
            f"{where}: routed_experts has {len(raw)} bytes, not a multiple of 4 x layers({num_layers}) "
            f"x topk({topk}) = {row_bytes}; wrong num_layers/topk or a truncated payload",
            sample=sample, turn=turn, num_bytes=len(raw), row_bytes=row_bytes)
    # no copy on little-endian hosts: a read-only view of the decoded bytes
    rows = np.frombuffer(raw, dtype=_LE_INT32).astype(np.int32, copy=False).reshape(-1, num_layers, topk)
    if num_tokens is not None and rows.shape[0] != num_tokens:
        raise RoutingError(
            f"{where}: routed_experts has {rows.shape[0]} rows but {num_tokens} were expected "
            "(positions [routed_experts_start_len, seqlen-1)); routing belongs to another token count",
            sample=sample, turn=turn, num_rows=rows.shape[0], expected_rows=num_tokens)
    if num_experts is not None and rows.size and (rows.min() < 0 or rows.max() >= num_experts):
        bad = int(np.flatnonzero(((rows < 0) | (rows >= num_experts)).any(axis=(1, 2)))[0])
        raise RoutingError(
            f"{where}: expert id out of range [0, {num_experts}) at row {bad} "
            f"(min {int(rows.min())}, max {int(rows.max())})",
            sample=sample, turn=turn, row=bad, num_experts=num_experts)
    return rows


# --- stitching ------------------------------------------------------------------
def _checked_segment(sample: str, i: int, start: int, seg: np.ndarray, shape_LK: tuple, num_tokens: int) -> int:
    """The end of segment ``i``; RoutingError if its rows have another shape or it leaves [0, num_tokens)."""
    if seg.shape[1:] != shape_LK:
        raise RoutingError(f"sample {sample}: segment {i} rows are {seg.shape[1:]}, expected {shape_LK}",
                           sample=sample, segment=i)
    end = start + seg.shape[0]
    if start < 0 or end > num_tokens:
        raise RoutingError(f"sample {sample}: segment {i} covers [{start}, {end}) outside "
                           f"[0, {num_tokens})", sample=sample, segment=i)
    return end


def stitch_rows(segments: Sequence[tuple[int, np.ndarray]], num_tokens: int,
                *, sample: str = "?") -> tuple[np.ndarray, np.ndarray]:
    """Place ``(start_position, rows)`` segments into one (num_tokens, L, K) array.

    Earlier segments win where segments overlap (a row is kept from the turn
    that first computed it). Returns ``(rows_NLK, has_row_N)``; positions that
    no segment covers have ``has_row_N == False`` and zero rows: the caller
    decides (see :func:`fill_missing_rows`).
    """
    if not segments:
        raise MissingRoutingError(f"sample {sample}: no routing segments to stitch", sample=sample)
    L, K = segments[0][1].shape[1:]
    rows = np.zeros((num_tokens, L, K), dtype=np.int32)
    has = np.zeros(num_tokens, dtype=bool)
    for i, (start, seg) in enumerate(segments):
        end = _checked_segment(sample, i, start, seg, (L, K), num_tokens)
        new = ~has[start:end]
        if new.all():  # the common case: a turn routes only positions not seen before
            rows[start:end] = seg
        else:
            rows[start:end][new] = seg[new]
        has[start:end] = True
    return rows, has


def fill_missing_rows(rows_NLK: np.ndarray, has_row_N: np.ndarray, loss_mask_N: np.ndarray,
                      *, sample: str = "?") -> np.ndarray:
    """Substitute a neighbour row where no gradient can be affected; otherwise raise.

    The row at position j shapes hidden states at positions >= j, whose logits
    predict tokens j+1.. . So a missing row is harmless only when no
    loss-bearing token sits after it (e.g. the last sampled token, which SGLang
    never routes). Returns the indices that were substituted (placeholders).
    """
    missing = np.flatnonzero(~has_row_N)
    if missing.size == 0:
        return missing
    loss_pos = np.flatnonzero(loss_mask_N)
    last_loss = int(loss_pos[-1]) if loss_pos.size else -1
    harmful = missing[missing < last_loss]
    if harmful.size:
        raise RoutingError(
            f"sample {sample}: {missing.size} position(s) have no routing row in any turn's capture; "
            f"{harmful.size} of them (first {int(harmful[0])}) precede loss-bearing tokens (last at "
            f"{last_loss}), so a substitute would change gradients. Re-request routing for them",
            sample=sample, missing=missing.tolist()[:16], last_loss=last_loss)
    present = np.flatnonzero(has_row_N)
    if present.size == 0:
        raise MissingRoutingError(f"sample {sample}: no position has a routing row", sample=sample)
    for j in missing:  # nearest earlier row, else the first row
        prev = present[present < j]
        rows_NLK[j] = rows_NLK[prev[-1] if prev.size else present[0]]
    return missing


def assert_row_count(num_tokens: int, rows_NLK: np.ndarray, *, sample: str = "?",
                     stage: str = "") -> None:
    """The per-sample relation: one routing row per token, after every transform."""
    if rows_NLK.shape[0] != num_tokens:
        raise RoutingError(
            f"sample {sample}{' at ' + stage if stage else ''}: {rows_NLK.shape[0]} routing rows "
            f"for {num_tokens} tokens; rows and tokens went through different transforms",
            sample=sample, stage=stage, num_rows=rows_NLK.shape[0], num_tokens=num_tokens)


# --- transforms (axis 0; the same functions for tokens and rows) -----------------
def pad_to_multiple(x: np.ndarray, multiple: int, pad_value: int = 0) -> np.ndarray:
    """Pad axis 0 up to a multiple of ``multiple`` (the token pipeline's padding)."""
    if multiple <= 0:
        raise InputError(f"multiple must be positive, got {multiple}", multiple=multiple)
    n = x.shape[0]
    extra = (-n) % multiple
    if extra == 0:
        return x
    out = np.empty((n + extra,) + x.shape[1:], dtype=x.dtype)  # one copy; only the tail is filled
    out[:n] = x
    out[n:] = pad_value
    return out


def unpad(x: np.ndarray, num_tokens: int) -> np.ndarray:
    """Inverse of :func:`pad_to_multiple`."""
    return x[:num_tokens]


def sp_split(x: np.ndarray, sp_size: int) -> list[np.ndarray]:
    """Sequence-parallel split of axis 0 into ``sp_size`` equal contiguous shards."""
    if sp_size <= 0 or x.shape[0] % sp_size:
        raise InputError(f"sequence length {x.shape[0]} is not divisible by sp_size={sp_size}; "
                         "pad first", length=x.shape[0], sp_size=sp_size)
    return np.split(x, sp_size, axis=0)


def sp_gather(shards: Sequence[np.ndarray]) -> np.ndarray:
    """Inverse of :func:`sp_split`."""
    return np.concatenate(list(shards), axis=0)


def zigzag_chunks(cp_size: int, rank: int) -> tuple[int, int]:
    """The two of ``2 * cp_size`` chunks that CP rank ``rank`` holds: r and 2CP-1-r."""
    if not 0 <= rank < cp_size:
        raise InputError(f"rank {rank} outside [0, cp_size={cp_size})", rank=rank, cp_size=cp_size)
    return rank, 2 * cp_size - 1 - rank


def cp_zigzag_slice(x: np.ndarray, cp_size: int, rank: int) -> np.ndarray:
    """Context-parallel zig-zag: rank r gets chunks r and 2CP-1-r of 2CP equal chunks."""
    n = x.shape[0]
    if cp_size <= 0 or n % (2 * cp_size):
        raise InputError(f"sequence length {n} is not divisible by 2 x cp_size = {2 * cp_size}; "
                         "pad to a multiple first", length=n, cp_size=cp_size)
    c = n // (2 * cp_size)
    a, b = zigzag_chunks(cp_size, rank)
    return np.concatenate([x[a * c:(a + 1) * c], x[b * c:(b + 1) * c]], axis=0)


def cp_zigzag_unslice(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Inverse of :func:`cp_zigzag_slice` over all ranks (``parts[r]`` from rank r)."""
    cp_size = len(parts)
    if cp_size == 0:
        raise InputError("cp_zigzag_unslice needs one part per rank, got 0", cp_size=0)
    c = parts[0].shape[0] // 2
    chunks: list[np.ndarray | None] = [None] * (2 * cp_size)
    for r, p in enumerate(parts):
        if p.shape[0] != 2 * c:
            raise InputError(f"rank {r} part has {p.shape[0]} rows, expected {2 * c}", rank=r)
        a, b = zigzag_chunks(cp_size, r)
        chunks[a], chunks[b] = p[:c], p[c:]
    return np.concatenate(chunks, axis=0)


def shard_for_rank(x: np.ndarray, *, num_tokens: int, sp_size: int, cp_size: int, cp_rank: int,
                   sp_rank: int, pad_value: int = 0) -> np.ndarray:
    """The whole token pipeline for one rank: pad to 2*CP*SP, CP zig-zag, then SP shard.

    Apply it to tokens and routing rows alike; :func:`assert_row_count` checks
    the input, the shapes of equal-length inputs stay equal by construction.
    """
    if x.shape[0] != num_tokens:
        raise RoutingError(f"{x.shape[0]} rows for {num_tokens} tokens before sharding",
                           num_rows=x.shape[0], num_tokens=num_tokens)
    padded = pad_to_multiple(x, 2 * cp_size * sp_size, pad_value)
    return sp_split(cp_zigzag_slice(padded, cp_size, cp_rank), sp_size)[sp_rank]


def unshard(parts_cp_sp: Sequence[Sequence[np.ndarray]], num_tokens: int) -> np.ndarray:
    """Inverse of :func:`shard_for_rank` given ``parts[cp_rank][sp_rank]``."""
    return unpad(cp_zigzag_unslice([sp_gather(sp) for sp in parts_cp_sp]), num_tokens)


# --- stitch straight into the CP layout (one copy) -----------------------------------
@dataclass
class ZigzagRows:
    """Stitched, padded rows laid out rank-major for context parallelism.

    ``buffer`` holds rank 0's two zig-zag chunks, then rank 1's, ...; ``parts[r]``
    is a contiguous view equal to ``cp_zigzag_slice(pad_to_multiple(rows, 2*CP), CP, r)``
    of the plain stitched ``rows``. ``has_row_N`` is as :func:`stitch_rows` returns it.
    """

    buffer: np.ndarray
    has_row_N: np.ndarray
    num_tokens: int
    cp_size: int

    @property
    def chunk(self) -> int:
        return self.buffer.shape[0] // (2 * self.cp_size)

    @property
    def parts(self) -> list[np.ndarray]:
        size = 2 * self.chunk
        return [self.buffer[r * size:(r + 1) * size] for r in range(self.cp_size)]

    def index(self, positions: np.ndarray) -> np.ndarray:
        """Buffer indices of sequence positions."""
        positions = np.asarray(positions)
        c, cp = self.chunk, self.cp_size
        q, within = np.divmod(positions, c)
        return np.where(q < cp, q * 2 * c, (2 * cp - 1 - q) * 2 * c + c) + within

    def fill_from_previous(self, positions: np.ndarray) -> None:
        """Give each listed position the row of the nearest earlier position that has one."""
        present = np.flatnonzero(self.has_row_N)
        if present.size == 0:
            raise MissingRoutingError("no position has a routing row")
        for j in np.asarray(positions):
            prev = present[present < j]
            self.buffer[self.index(j)] = self.buffer[self.index(prev[-1] if prev.size else present[0])]


def stitch_zigzag(segments: Sequence[tuple[int, np.ndarray]], num_tokens: int, cp_size: int,
                  *, multiple: int = 1, sample: str = "?") -> ZigzagRows:
    """:func:`stitch_rows`, :func:`pad_to_multiple` (``2 * cp_size * multiple``) and
    :func:`cp_zigzag_slice` for every rank, copying each row once (no intermediate arrays).

    Same overlap rule (earlier segments win) and same zero rows for positions no
    segment covers and for the padding.
    """
    if not segments:
        raise MissingRoutingError(f"sample {sample}: no routing segments to stitch", sample=sample)
    if cp_size <= 0 or multiple <= 0:
        raise InputError(f"cp_size ({cp_size}) and multiple ({multiple}) must be positive")
    L, K = segments[0][1].shape[1:]
    step = 2 * cp_size * multiple
    padded = num_tokens + (-num_tokens) % step
    out = ZigzagRows(np.empty((padded, L, K), dtype=np.int32), np.zeros(num_tokens, dtype=bool), num_tokens, cp_size)
    c = out.chunk
    for i, (start, seg) in enumerate(segments):
        end = _checked_segment(sample, i, start, seg, (L, K), num_tokens)
        pos = start
        while pos < end:  # one piece per zig-zag chunk the segment crosses
            stop = min(end, (pos // c + 1) * c)
            dst = int(out.index(pos))
            src = seg[pos - start:stop - start]
            new = ~out.has_row_N[pos:stop]
            if new.all():
                out.buffer[dst:dst + stop - pos] = src
            else:
                out.buffer[dst:dst + stop - pos][new] = src[new]
            out.has_row_N[pos:stop] = True
            pos = stop
    missing = np.flatnonzero(~out.has_row_N)
    if missing.size:
        out.buffer[out.index(missing)] = 0
    if padded > num_tokens:
        out.buffer[out.index(np.arange(num_tokens, padded))] = 0
    return out
