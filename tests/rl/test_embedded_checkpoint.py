"""The embedded engine refuses bad actor checkpoints with a named CheckpointError (no torch needed)."""
from __future__ import annotations

import json

import pytest

from rl.engines.embedded_engine import check_actor_checkpoint
from rl.errors import CheckpointError, CheckpointRoleError


def _ckpt(tmp_path, manifest, weights=b"w"):
    (tmp_path / "manifest.json").write_bytes(manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode())
    if weights is not None:
        (tmp_path / "weights.pt").write_bytes(weights)
    return tmp_path


@pytest.mark.parametrize("manifest", [b"\xff\xfe\x00", b"[" * 50_000, b"{not json", {"role": "actor"}])
def test_bad_manifests_are_refused(tmp_path, manifest):
    with pytest.raises(CheckpointError):
        check_actor_checkpoint(_ckpt(tmp_path, manifest))


def test_role_and_missing_weights(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(CheckpointRoleError, match="critic"):
        check_actor_checkpoint(_ckpt(tmp_path / "a", {"role": "critic", "file_sha256": "0"}))
    with pytest.raises(CheckpointError, match="cannot read"):
        check_actor_checkpoint(_ckpt(tmp_path / "b", {"role": "actor", "file_sha256": "0"}, weights=None))
