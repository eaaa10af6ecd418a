"""Fuzz checkpoint manifests and weight files (t1ops/guards/checkpoints.py).

A step directory is outside data after a crash, a partial copy or a hand
edit: a truncated or random manifest, one manifest field of the wrong type,
a weight file that is truncated, random, a pickle of something else, or
consistent with a manifest that lies about it must raise CheckpointError
(CheckpointRoleError for another role's weights) naming the path, never load
anything and never touch the files. Valid checkpoints round-trip.
"""
from __future__ import annotations

import io
import json
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz_common import FAST, SLOW_IO, json_values, mutate, mutations, only_t1ops_errors
from rl.errors import CheckpointError
from t1ops.guards.checkpoints import (MANIFEST_FILE, WEIGHTS_FILE, file_sha256, load_checkpoint, read_manifest,
                                      save_checkpoint)

STATE = {"embedding.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
         "head.weight": torch.ones(2, 4, dtype=torch.bfloat16),
         "layers.0._extra_state": None}

_TEMPLATE = Path(tempfile.mkdtemp(prefix="t1ops-fuzz-ckpt-"))
STEP_DIR = save_checkpoint(_TEMPLATE / "actor", "actor", 3, STATE)
MANIFEST = json.loads((STEP_DIR / MANIFEST_FILE).read_text())
WEIGHTS = (STEP_DIR / WEIGHTS_FILE).read_bytes()


def _load(manifest: bytes | dict | None = None, weights: bytes | None = None, *, resign: bool = False):
    """load_checkpoint on a copy of the template with the given files; ``resign`` re-hashes the weights."""
    with tempfile.TemporaryDirectory() as tmp:
        step = Path(tmp) / "actor" / STEP_DIR.name
        shutil.copytree(STEP_DIR, step)
        if weights is not None:
            (step / WEIGHTS_FILE).write_bytes(weights)
        if isinstance(manifest, dict):
            m = dict(manifest)
            if resign:
                m["file_sha256"] = file_sha256(step / WEIGHTS_FILE)
            manifest = json.dumps(m).encode()
        if manifest is not None:
            (step / MANIFEST_FILE).write_bytes(manifest)
        before = {p.name: p.read_bytes() for p in step.iterdir()}
        out = None
        with only_t1ops_errors(CheckpointError) as caught:
            out = load_checkpoint(step, "actor")
        if caught:
            assert str(step) in str(caught[0]), str(caught[0])
        assert {p.name: p.read_bytes() for p in step.iterdir()} == before, "a refused load touched the files"
        return caught, out


def _assert_loaded(out) -> None:
    state, manifest = out
    assert set(state) == set(STATE) and manifest["role"] == "actor"
    for k, v in STATE.items():
        assert (v is None and state[k] is None) or torch.equal(state[k], v), k


def test_valid_checkpoint_round_trips():
    caught, out = _load()
    assert not caught
    _assert_loaded(out)


# --- manifests ----------------------------------------------------------------------------
@SLOW_IO
@given(st.binary(max_size=80) | json_values.map(lambda v: json.dumps(v).encode())
       | st.integers(0, len(json.dumps(MANIFEST)) - 1).map(lambda n: json.dumps(MANIFEST).encode()[:n]))
@example(b"[" * 50_000)                    # nesting bomb
@example(b"\xff\xfe{}")                    # not UTF-8
@example(b'{"role": "actor"}')             # missing keys
def test_random_manifest_is_a_checkpoint_error(content):
    caught, out = _load(content)
    assert caught, "a random manifest was accepted"


def test_manifest_that_is_a_directory_is_a_checkpoint_error():
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / MANIFEST_FILE).mkdir()
        with only_t1ops_errors(CheckpointError) as caught:
            read_manifest(tmp)
        assert caught and tmp in str(caught[0])


@SLOW_IO
@given(mutations(MANIFEST), st.booleans())
@example((("tensors",), 5, False), True)
@example((("tensors",), ["embedding.weight", "head.weight"], False), True)
@example((("tensors", "embedding.weight"), [3, 4], False), True)
@example((("tensors", "embedding.weight", "shape"), "34", False), True)
@example((("none_keys",), 7, False), True)
@example((("none_keys",), [["x"]], False), True)
@example((("role",), ["actor"], False), True)
def test_one_mutated_manifest_field_is_refused_or_harmless(edit, resign):
    path, value, delete = edit
    manifest = mutate(MANIFEST, path, value, delete)
    caught, out = _load(manifest, resign=resign and path[0] != "file_sha256")
    if not caught:  # accepted: the edit did not change what is loaded (e.g. the version or dtype note)
        _assert_loaded(out)
        assert path[0] in ("version", "step") or path[-1] == "dtype", f"{path} -> {value!r} was accepted"


# --- weight files --------------------------------------------------------------------------
def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class _Evil:
    def __reduce__(self):
        return (Path.touch, (Path(tempfile.gettempdir()) / "t1ops-fuzz-ckpt-pickle-ran",))


_weights = (st.binary(max_size=200)
            | st.integers(0, len(WEIGHTS) - 1).map(lambda n: WEIGHTS[:n])
            | st.sampled_from([_torch_bytes([1, 2]), _torch_bytes(torch.ones(3)), _torch_bytes({"embedding.weight": 5}),
                               _torch_bytes(["embedding.weight", "head.weight", "layers.0._extra_state"]),
                               _torch_bytes({**STATE, "head.weight": torch.zeros(2, 4, dtype=torch.bfloat16)}),
                               _torch_bytes({**STATE, "layers.0._extra_state": torch.ones(1)}),
                               _torch_bytes({**STATE, "head.weight": torch.ones(4, 2, dtype=torch.bfloat16)}),
                               pickle.dumps(_Evil()), pickle.dumps(STATE)]))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the fuzzed files use any protocol
@SLOW_IO
@given(_weights, st.booleans())
@example(WEIGHTS[: len(WEIGHTS) // 2], True)
@example(_torch_bytes({"embedding.weight": 5, "head.weight": "x", "layers.0._extra_state": None}), True)
@example(pickle.dumps(_Evil()), True)
def test_bad_weight_files_are_refused_even_when_the_manifest_matches_them(content, resign):
    marker = Path(tempfile.gettempdir()) / "t1ops-fuzz-ckpt-pickle-ran"
    marker.unlink(missing_ok=True)
    caught, out = _load(MANIFEST, content, resign=resign)
    assert not marker.exists(), "a pickle in a weight file ran code"
    if not caught:
        assert content == WEIGHTS
        _assert_loaded(out)


@FAST
@given(st.sampled_from(["actor", "critic", "Actor", "", "actor "]))
def test_another_roles_manifest_is_refused(role):
    caught, _ = _load({**MANIFEST, "role": role})
    assert bool(caught) == (role != "actor")
    if caught:
        assert "actor" in str(caught[0])
