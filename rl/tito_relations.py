"""TITO's prefix relations, pure functions over token arrays (used by :class:`rl.tito.TitoBuilder`).

``normalized``: one bounded repair at the first divergence (drop ``a`` < 97 stream
tokens, skip ``b`` < 17 prompt tokens: the report's 97 x 17 grid); ``retokenized``:
the stream's bytes are a prefix of the prompt's at a token boundary.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from rl.chat import token_bytes

MAX_DROP_STREAM = 97   # a in [0, 97): stream tokens a repair may step over
MAX_SKIP_PROMPT = 17   # b in [0, 17): harness tokens a repair may step over


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D int arrays."""
    n = min(a.shape[0], b.shape[0])
    neq = np.flatnonzero(a[:n] != b[:n])
    return int(neq[0]) if neq.size else n


def find_normalized_repair(stream: np.ndarray, prompt: np.ndarray) -> tuple[int, int, int] | None:
    """Smallest (i, a, b): stream[i+a:] == prompt[i+b : i+b+n-i-a], a < 97, b < 17, i+a < n.

    ``i`` is the first divergence. At most 97 x 17 candidates are tried, in
    order of a + b, so the repair is bounded and enumerable. ``None`` if none fits.
    """
    n, m = stream.shape[0], prompt.shape[0]
    i = common_prefix_len(stream, prompt)
    for total in range(1, MAX_DROP_STREAM + MAX_SKIP_PROMPT - 1):
        for a in range(max(0, total - MAX_SKIP_PROMPT + 1), min(total, MAX_DROP_STREAM - 1) + 1):
            b = total - a
            tail = n - i - a
            # tail >= 1: the stream's end (its stop token) must realign, otherwise the
            # "repair" would let the harness's copy of the turn in as observation
            if tail < 1 or i + b + tail > m:
                continue
            if stream[i + a] != prompt[i + b]:  # cheap filter before the full compare
                continue
            if np.array_equal(stream[i + a:], prompt[i + b:i + b + tail]):
                return i, a, b
    return None


def find_retokenized_span(stream_offsets: Sequence[int], stream_bytes: bytes,
                          prompt_ids: Sequence[int], tokenizer) -> tuple[int, list[int]] | None:
    """Text-space relation: where the stream's bytes end inside the prompt.

    Returns ``(m, prompt_offsets)`` with ``prompt[:m]`` decoding to exactly the
    stream's bytes (``m`` < len(prompt)), or ``None``.
    """
    total = stream_offsets[-1]
    offsets, buf = [0], bytearray()
    for q, tid in enumerate(prompt_ids):
        if offsets[-1] == total:
            return (q, offsets) if bytes(buf) == stream_bytes else None
        if offsets[-1] > total:
            return None
        piece = token_bytes(tokenizer, tid)
        buf += piece
        offsets.append(offsets[-1] + len(piece))
    return None
