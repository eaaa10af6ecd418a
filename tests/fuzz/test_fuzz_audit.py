"""Fuzz the trajectory dump reader (t1ops/audit.py: read_trajectory, audit_dump).

A dump directory is outside data (copied between machines, half-written by a
crashed run, or planted). Corrupt or truncated npz files, missing keys,
arrays of mismatched length or the wrong shape/dtype, meta that is not a
JSON object, and pickled object arrays must raise ParseError naming the file
(and the key); a pickle must never be loaded. Valid chunks round-trip.
"""
from __future__ import annotations

import io
import json
import pickle
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz_common import FAST, SLOW_IO, json_values, only_t1ops_errors
from rl.errors import ParseError
from rl.tito import RELATIONS, Trajectory
from t1ops.audit import ARRAY_KEYS, audit_dump, read_trajectory, write_trajectory

_TOKEN_KEYS = ("tokens", "engine_tokens")


def _traj(n: int, routing: bool = True, seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed)
    mask = (rng.random(n) < 0.5).astype(np.int8)
    tokens = rng.integers(0, 1000, n)
    return Trajectory(tokens=tokens, loss_mask=mask,
                      rollout_logprobs=np.where(mask == 1, -0.5, 0).astype(np.float32),
                      engine_tokens=tokens.copy(), origin=rng.integers(0, 3, n).astype(np.int8),
                      policy_version=np.where(mask == 1, 3, -1).astype(np.int32),
                      routing=rng.integers(0, 8, (n, 2, 2)).astype(np.int32) if routing else None,
                      meta={"sample_id": f"s{seed}", "chunk_id": 0, "relations": ["strict", "split"]})


def _arrays(traj: Trajectory) -> dict:
    d = {k: getattr(traj, k) for k in ARRAY_KEYS}
    d["routing"] = d["routing"] if d["routing"] is not None else np.zeros((0,), np.int32)
    d["meta"] = np.array(json.dumps(traj.meta))
    return d


def _npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


VALID_BYTES = _npz_bytes(_arrays(_traj(12)))


def _read_bytes(content: bytes) -> tuple[list, Trajectory | None]:
    """read_trajectory on a file holding ``content``; then audit its directory too."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s0.c0.npz"
        path.write_bytes(content)
        traj = None
        with only_t1ops_errors(ParseError) as caught:
            traj = read_trajectory(path)
        if caught:
            assert str(path) in str(caught[0]), str(caught[0])
            with only_t1ops_errors(ParseError) as again:
                audit_dump(Path(tmp))
            assert again, "audit_dump accepted a dump read_trajectory refused"
        else:
            _check_readable(traj)
            assert audit_dump(Path(tmp)).positions == len(traj)
        return caught, traj


def _check_readable(traj: Trajectory) -> None:
    """What an accepted chunk guarantees to the audit."""
    n = len(traj)
    for key in ARRAY_KEYS[:-1]:
        arr = getattr(traj, key)
        assert arr.shape == (n,), (key, arr.shape)
        assert arr.dtype.kind in ("f" if key == "rollout_logprobs" else "iub"), (key, arr.dtype)
    assert traj.routing is None or (traj.routing.ndim == 3 and traj.routing.shape[0] == n)
    assert isinstance(traj.meta, dict)
    assert all(r in RELATIONS for r in traj.meta.get("relations", []))
    traj.accounting()


# --- byte-level corruption ----------------------------------------------------------------
@SLOW_IO
@given(st.integers(0, len(VALID_BYTES) - 1))
@example(len(VALID_BYTES) - 30)
def test_truncated_file_is_a_parse_error(n):
    caught, _ = _read_bytes(VALID_BYTES[:n])
    assert caught


@SLOW_IO
@given(st.lists(st.tuples(st.integers(0, len(VALID_BYTES) - 1), st.integers(1, 255)), min_size=1, max_size=4))
def test_bit_flips_are_refused_or_read_consistently(flips):
    content = bytearray(VALID_BYTES)
    for pos, mask in flips:
        content[pos] ^= mask
    _read_bytes(bytes(content))


def _npy_bytes() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.arange(3))
    return buf.getvalue()


@SLOW_IO
@given(st.binary(max_size=300) | st.just(b"PK\x03\x04" + bytes(40)) | st.just(pickle.dumps({"tokens": [1]})))
@example(_npy_bytes())        # a plain .npy renamed: np.load returns an array, not an archive
@example(b"")
def test_random_bytes_are_a_parse_error(content):
    caught, _ = _read_bytes(content)
    assert caught


# --- well-formed npz with bad contents -------------------------------------------------------
_odd_arrays = st.sampled_from([
    np.zeros((), np.int64),                 # 0-d
    np.zeros((3, 2), np.int64),             # 2-D
    np.zeros((5,), np.int64),               # another length
    np.array(["a", "b", "c"]),              # strings
    np.zeros((3,), np.complex64),           # complex
    np.zeros((3,), "datetime64[s]"),        # not a number
    np.zeros((3,), np.float64),             # float where ints belong
    np.zeros((3, 2, 2, 1), np.int32),       # 4-D routing
    np.array([b"x", b"y", b"z"]),           # bytes
])


@SLOW_IO
@given(st.sampled_from(ARRAY_KEYS + ("meta",)), st.booleans(), _odd_arrays)
@example("tokens", False, np.zeros((), np.int64))
@example("meta", False, np.zeros((), np.int64))
@example("routing", False, np.zeros((3, 2), np.int32))
@example("loss_mask", False, np.array(["a", "b", "c"]))
def test_missing_or_odd_array_is_refused_or_consistent(key, drop, arr):
    arrays = _arrays(_traj(3))
    if drop:
        del arrays[key]
    else:
        arrays[key] = arr
    caught, traj = _read_bytes(_npz_bytes(arrays))
    if caught:
        assert key in str(caught[0]) or "meta" in str(caught[0]), str(caught[0])


@SLOW_IO
@given(json_values.map(json.dumps) | st.text(max_size=30))
@example(json.dumps({"relations": "strict"}))
@example(json.dumps({"relations": [["strict"]]}))
@example(json.dumps({"relations": ["bogus"]}))
@example(json.dumps([1, 2]))
@example("{")
def test_meta_must_be_a_json_object_with_known_relations(meta_text):
    arrays = _arrays(_traj(4))
    arrays["meta"] = np.array(meta_text)
    caught, traj = _read_bytes(_npz_bytes(arrays))
    if caught:
        assert "meta" in str(caught[0]), str(caught[0])


class _Bomb:
    """Unpickling this would run code: the reader must never get that far."""

    def __reduce__(self):
        return (Path.touch, (Path(tempfile.gettempdir()) / "t1ops-fuzz-pickle-ran",))


@SLOW_IO
@given(st.sampled_from(ARRAY_KEYS + ("meta",)))
def test_pickled_object_arrays_never_load(key):
    marker = Path(tempfile.gettempdir()) / "t1ops-fuzz-pickle-ran"
    marker.unlink(missing_ok=True)
    arrays = _arrays(_traj(3))
    arrays[key] = np.array([_Bomb(), _Bomb(), _Bomb()], dtype=object)
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # savez pickles object arrays (allow_pickle defaults to True on save)
    caught, _ = _read_bytes(buf.getvalue())
    assert caught and not marker.exists()


@FAST
@given(st.integers(0, 40), st.booleans(), st.integers(0, 2**16), json_values)
def test_valid_chunks_round_trip(n, routing, seed, extra):
    traj = _traj(n, routing, seed)
    with tempfile.TemporaryDirectory() as tmp:
        back = read_trajectory(write_trajectory(traj, Path(tmp), extra=extra))
    for key in ARRAY_KEYS:
        a, b = getattr(traj, key), getattr(back, key)
        assert (a is None and b is None) or (np.array_equal(a, b) and a.dtype == b.dtype), key
    assert json.dumps(back.meta) == json.dumps({**traj.meta, "extra": extra})  # NaN-safe equality


def test_a_zip_with_extra_members_still_needs_every_key():
    buf = io.BytesIO()
    member = io.BytesIO()
    np.save(member, np.arange(4))  # a well-formed member: the only problem is the keys the zip lacks
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("tokens.npy", member.getvalue())
    caught, _ = _read_bytes(buf.getvalue())
    assert caught and "lacks" in str(caught[0])
