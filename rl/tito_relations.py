"""TITO's prefix relations, pure functions over token arrays (used by :class:`rl.tito.TitoBuilder`).

``normalized``: one bounded repair at the first divergence (drop ``a`` < 97 stream
tokens, skip ``b`` < 17 prompt tokens: the report's 97 x 17 grid), after which the rest
of the stream must reappear in the prompt. What counts as reappearing is tight: a tail
with fewer than 2 non-stop tokens (one ``<|im_end|>``) is evidence of nothing, since any
prompt holds one, so it realigns only a local repair (``a``, ``b`` <= 8: a few ids
re-encoded). An unrelated prompt is a split.
``retokenized``: the stream's bytes are a prefix of the prompt's at a token boundary.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from rl.chat import STOP_IDS, token_bytes

MAX_DROP_STREAM = 97   # a in [0, 97): stream tokens a repair may step over
MAX_SKIP_PROMPT = 17   # b in [0, 17): harness tokens a repair may step over
MAX_LOCAL_REPAIR = 8   # a, b at most this when the realigned tail is only stop tokens
MIN_TAIL_CONTENT = 2   # otherwise the realigned tail holds at least this many non-stop tokens


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D int arrays."""
    n = min(a.shape[0], b.shape[0])
    neq = np.flatnonzero(a[:n] != b[:n])
    return int(neq[0]) if neq.size else n


def find_normalized_repair(stream: np.ndarray, prompt: np.ndarray,
                           stop_ids: frozenset[int] = STOP_IDS) -> tuple[int, int, int] | None:
    """Smallest (i, a, b): stream[i+a:] == prompt[i+b : i+b+n-i-a], a < 97, b < 17, i+a < n,
    and the realigned tail is evidence (module docstring: a tail of fewer than 2 non-stop
    tokens realigns only a local repair, a and b <= 8).

    ``i`` is the first divergence. At most 97 x 17 candidates are tried, in
    order of a + b, so the repair is bounded and enumerable. ``None`` if none fits.
    """
    n, m = stream.shape[0], prompt.shape[0]
    i = common_prefix_len(stream, prompt)
    # content_from[k]: non-stop tokens in stream[k:]
    is_content = ~np.isin(stream, np.fromiter(stop_ids, dtype=np.int64)) if stop_ids else np.ones(n, bool)
    content_from = np.concatenate([np.cumsum(is_content[::-1])[::-1], [0]])
    for total in range(1, MAX_DROP_STREAM + MAX_SKIP_PROMPT - 1):
        for a in range(max(0, total - MAX_SKIP_PROMPT + 1), min(total, MAX_DROP_STREAM - 1) + 1):
            b = total - a
            tail = n - i - a
            # tail >= 1: the stream's end (its stop token) must realign, otherwise the
            # "repair" would let the harness's copy of the turn in as observation
            if tail < 1 or i + b + tail > m:
                continue
            content = int(content_from[i + a])
            if content < MIN_TAIL_CONTENT and (a > MAX_LOCAL_REPAIR or b > MAX_LOCAL_REPAIR):
                continue  # a lone stop token (or one stray id) realigns nothing but a local repair
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
