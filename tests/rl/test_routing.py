"""Routing rows: codec, stitching, the token pipeline's transforms, bad input."""
from __future__ import annotations

import base64

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.errors import InputError, MissingRoutingError, RoutingError
from rl.routing import (
    assert_row_count, cp_zigzag_slice, cp_zigzag_unslice, decode_routed_experts,
    encode_routed_experts, expected_num_rows, fill_missing_rows, pad_to_multiple, shard_for_rank,
    sp_gather, sp_split, stitch_rows, stitch_zigzag, unpad, unshard, zigzag_chunks,
)


def rows_strategy(max_tokens: int = 40):
    return st.tuples(st.integers(0, max_tokens), st.integers(1, 4), st.integers(1, 4),
                     st.integers(0, 2**31 - 1)).map(
        lambda t: np.random.default_rng(t[3]).integers(0, 64, size=t[:3], dtype=np.int32))


@given(rows_strategy())
def test_codec_roundtrip(rows):
    out = decode_routed_experts(encode_routed_experts(rows), rows.shape[1], rows.shape[2],
                                num_tokens=rows.shape[0], num_experts=64)
    assert out.dtype == np.int32 and out.shape == rows.shape
    assert np.array_equal(out, rows)


def test_codec_is_little_endian_int32():
    rows = np.array([[[1, 256]]], dtype=np.int32)
    assert base64.b64decode(encode_routed_experts(rows)) == b"\x01\x00\x00\x00\x00\x01\x00\x00"


def test_expected_rows_excludes_last_token():
    assert expected_num_rows(seqlen=10, start_len=0) == 9
    assert expected_num_rows(seqlen=10, start_len=4) == 5
    with pytest.raises(RoutingError):
        expected_num_rows(seqlen=10, start_len=10)


def test_bad_inputs_name_sample_turn_and_counts():
    rows = np.zeros((3, 2, 2), dtype=np.int32)
    b64 = encode_routed_experts(rows)
    with pytest.raises(RoutingError, match="not valid base64"):
        decode_routed_experts("@@@", 2, 2, sample="s1", turn=2)
    with pytest.raises(RoutingError, match="sample s1 turn 2.*48 bytes, not a multiple.*= 20"):
        decode_routed_experts(b64, 5, 1, sample="s1", turn=2)
    with pytest.raises(RoutingError, match="3 rows but 4 were expected"):
        decode_routed_experts(b64, 2, 2, num_tokens=4)
    truncated = base64.b64encode(base64.b64decode(b64)[:-2]).decode()
    with pytest.raises(RoutingError, match="46 bytes"):
        decode_routed_experts(truncated, 2, 2)
    rows[1, 0, 1] = 9
    with pytest.raises(RoutingError, match=r"out of range \[0, 8\) at row 1"):
        decode_routed_experts(encode_routed_experts(rows), 2, 2, num_experts=8)
    with pytest.raises(MissingRoutingError, match="sample trial-7 turn 3"):
        decode_routed_experts(None, 2, 2, num_tokens=3, sample="trial-7", turn=3)
    with pytest.raises(RoutingError, match="3-D"):
        encode_routed_experts(np.zeros((3, 4)))


def test_missing_routing_is_a_routing_and_value_error():
    assert issubclass(MissingRoutingError, RoutingError)
    assert issubclass(MissingRoutingError, ValueError)


@given(st.integers(1, 60), st.lists(st.integers(0, 59), min_size=1, max_size=6))
def test_stitch_row_j_is_token_j(num_tokens, starts):
    # every token j carries row value j in every segment that covers it
    ids = np.arange(num_tokens, dtype=np.int32)
    segs = []
    for s in sorted({min(s, num_tokens - 1) for s in starts}):
        end = min(num_tokens, s + 7)
        segs.append((s, np.repeat(ids[s:end, None, None], 2, axis=2)))
    rows, has = stitch_rows(segs, num_tokens)
    assert np.array_equal(rows[has][:, 0, 0], ids[has])
    assert np.array_equal(rows[~has], np.zeros_like(rows[~has]))


def test_fill_missing_only_where_no_gradient():
    rows = np.arange(5, dtype=np.int32).reshape(5, 1, 1).copy()
    has = np.array([1, 1, 1, 1, 0], dtype=bool)
    mask = np.array([0, 0, 1, 1, 1])
    assert fill_missing_rows(rows, has, mask).tolist() == [4]
    assert rows[4, 0, 0] == 3  # the neighbour
    has = np.array([1, 0, 1, 1, 1], dtype=bool)
    with pytest.raises(RoutingError, match="precede loss-bearing tokens"):
        fill_missing_rows(rows, has, mask, sample="s9")


@settings(max_examples=60)
@given(st.integers(0, 90), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 3]))
def test_pipeline_inverse_is_identity_and_rows_follow_tokens(num_tokens, cp, sp):
    tokens = np.arange(100, 100 + num_tokens)
    rows = np.repeat(tokens.astype(np.int32)[:, None, None], 3, axis=1)
    assert_row_count(num_tokens, rows)
    tok_parts = [[shard_for_rank(tokens, num_tokens=num_tokens, sp_size=sp, cp_size=cp,
                                 cp_rank=c, sp_rank=s) for s in range(sp)] for c in range(cp)]
    row_parts = [[shard_for_rank(rows, num_tokens=num_tokens, sp_size=sp, cp_size=cp,
                                 cp_rank=c, sp_rank=s) for s in range(sp)] for c in range(cp)]
    for c in range(cp):
        for s in range(sp):
            assert_row_count(tok_parts[c][s].shape[0], row_parts[c][s])
            real = tok_parts[c][s] != 0  # padding is 0 for both
            assert np.array_equal(row_parts[c][s][real, 0, 0], tok_parts[c][s][real])
    assert np.array_equal(unshard(tok_parts, num_tokens), tokens)
    assert np.array_equal(unshard(row_parts, num_tokens), rows)


def test_zigzag_layout():
    x = np.arange(8)
    assert zigzag_chunks(2, 0) == (0, 3)
    assert cp_zigzag_slice(x, 2, 0).tolist() == [0, 1, 6, 7]
    assert cp_zigzag_slice(x, 2, 1).tolist() == [2, 3, 4, 5]
    assert np.array_equal(cp_zigzag_unslice([cp_zigzag_slice(x, 2, r) for r in range(2)]), x)
    with pytest.raises(InputError, match="divisible by 2 x cp_size"):
        cp_zigzag_slice(np.arange(6), 2, 0)


def test_pad_and_sp():
    x = np.arange(5)
    p = pad_to_multiple(x, 4)
    assert p.tolist() == [0, 1, 2, 3, 4, 0, 0, 0]
    assert np.array_equal(unpad(p, 5), x)
    assert np.array_equal(sp_gather(sp_split(p, 4)), p)
    with pytest.raises(InputError):
        sp_split(x, 2)


def test_row_count_assertion():
    with pytest.raises(RoutingError, match="sample s3 at cp: 4 routing rows for 5 tokens"):
        assert_row_count(5, np.zeros((4, 2, 2), np.int32), sample="s3", stage="cp")


@given(st.integers(1, 60), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2**31 - 1))
@settings(max_examples=60)
def test_one_copy_zigzag_stitch_equals_stitch_pad_slice(num_tokens, cp_size, multiple, seed):
    """stitch_zigzag gives every rank exactly what stitch_rows + pad_to_multiple + cp_zigzag_slice give,
    with overlapping segments (earlier wins) and uncovered positions (zero rows, has False)."""
    rng = np.random.default_rng(seed)
    segments = []
    for _ in range(rng.integers(1, 5)):
        start = int(rng.integers(0, num_tokens))
        length = int(rng.integers(0, num_tokens - start + 1))
        segments.append((start, rng.integers(0, 64, (length, 2, 3), dtype=np.int32)))
    rows, has = stitch_rows(segments, num_tokens)
    padded = pad_to_multiple(rows, 2 * cp_size * multiple)
    out = stitch_zigzag(segments, num_tokens, cp_size, multiple=multiple)
    assert np.array_equal(out.has_row_N, has)
    for r, part in enumerate(out.parts):
        assert np.array_equal(part, cp_zigzag_slice(padded, cp_size, r))
    missing = np.flatnonzero(~has)
    if has.any() and missing.size:
        fill_missing_rows(rows, has, np.zeros(num_tokens, dtype=bool))
        out.fill_from_previous(missing)
        padded = pad_to_multiple(rows, 2 * cp_size * multiple)
        assert all(np.array_equal(p, cp_zigzag_slice(padded, cp_size, r)) for r, p in enumerate(out.parts))
