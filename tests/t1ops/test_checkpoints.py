"""Role-safe checkpoints (T1 report, section 09: the critic overwrote the actor)."""
from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from t1ops.errors import CheckpointError, CheckpointRoleError
from t1ops.guards.checkpoints import (CheckpointManager, check_role_dirs, file_sha256, list_steps,
                                      load_checkpoint, read_manifest,
                                      save_checkpoint, step_dir_name)


def _actor_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embedding.weight": torch.randn(16, 8, generator=g),
            "output_layer.weight": torch.randn(16, 8, generator=g).to(torch.bfloat16)}


def _megatron_like_state(seed: int = 0) -> dict:
    return {**_actor_state(seed), "decoder.layers.0.self_attention.linear_qkv._extra_state": None}


def _critic_state(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embedding.weight": torch.randn(16, 8, generator=g), "value_head.weight": torch.randn(1, 8, generator=g)}


def test_trainer_checkpoint_from_base_dirs_are_role_suffixed_siblings(tmp_path):
    m = CheckpointManager.from_base(tmp_path / "ckpt")
    assert m.actor_dir.name == "actor" and m.critic_dir.name == "critic"
    assert m.actor_dir.parent == m.critic_dir.parent


def test_trainer_checkpoint_identical_dirs_refused_before_anything_is_written(tmp_path):
    actor_args = {"save": str(tmp_path / "run"), "lr": 1e-6}
    critic_args = copy.deepcopy(actor_args)  # the report's bug: the copy keeps the save dir
    critic_args["lr"] = 1.5e-5
    with pytest.raises(CheckpointRoleError, match="identical") as err:
        CheckpointManager(actor_args["save"], critic_args["save"])
    assert err.value.context["actor_dir"] == err.value.context["critic_dir"]
    assert not (tmp_path / "run").exists()


def test_trainer_checkpoint_nested_and_equivalent_paths_refused(tmp_path):
    with pytest.raises(CheckpointRoleError, match="nested"):
        check_role_dirs(tmp_path / "a", tmp_path / "a" / "critic")
    with pytest.raises(CheckpointRoleError, match="identical"):
        check_role_dirs(tmp_path / "a", tmp_path / "b" / ".." / "a")


def test_trainer_checkpoint_roundtrip_with_manifest(tmp_path):
    state = _megatron_like_state()
    step_dir = save_checkpoint(tmp_path / "actor", "actor", 4, state)
    assert step_dir.name == step_dir_name(4)
    manifest = read_manifest(step_dir)
    assert manifest["role"] == "actor" and manifest["step"] == 4
    assert manifest["tensors"]["embedding.weight"]["shape"] == [16, 8]
    assert manifest["tensors"]["output_layer.weight"]["dtype"] == "bfloat16"
    assert manifest["file_sha256"] == file_sha256(step_dir / "weights.pt")
    loaded, _ = load_checkpoint(step_dir, "actor")
    assert set(loaded) == set(state)
    assert manifest["none_keys"] == ["decoder.layers.0.self_attention.linear_qkv._extra_state"]
    for k in _actor_state():
        assert torch.equal(loaded[k], state[k]) and loaded[k].dtype == state[k].dtype
    assert not [p for p in (tmp_path / "actor").iterdir() if p.name.startswith(".tmp")]


def test_trainer_checkpoint_load_of_other_role_refused(tmp_path):
    step_dir = save_checkpoint(tmp_path / "critic", "critic", 2, _critic_state())
    with pytest.raises(CheckpointRoleError, match="critic's weights, not the actor's") as err:
        load_checkpoint(step_dir, "actor")
    assert err.value.context["found_role"] == "critic"


def test_trainer_checkpoint_save_into_other_roles_dir_refused(tmp_path):
    save_checkpoint(tmp_path / "shared", "actor", 1, _actor_state())
    before = file_sha256(tmp_path / "shared" / step_dir_name(1) / "weights.pt")
    with pytest.raises(CheckpointRoleError, match="already holds actor"):
        save_checkpoint(tmp_path / "shared", "critic", 2, _critic_state())
    assert list_steps(tmp_path / "shared") == [1]
    assert file_sha256(tmp_path / "shared" / step_dir_name(1) / "weights.pt") == before


def test_trainer_checkpoint_existing_step_never_overwritten(tmp_path):
    save_checkpoint(tmp_path / "actor", "actor", 3, _actor_state(0))
    with pytest.raises(CheckpointError, match="never overwritten"):
        save_checkpoint(tmp_path / "actor", "actor", 3, _actor_state(1))
    loaded, _ = load_checkpoint(tmp_path / "actor" / step_dir_name(3), "actor")
    assert torch.equal(loaded["embedding.weight"], _actor_state(0)["embedding.weight"])


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_trainer_checkpoint_corrupt_refused_and_left_in_place(tmp_path, damage):
    step_dir = save_checkpoint(tmp_path / "actor", "actor", 1, _actor_state())
    weights = step_dir / "weights.pt"
    if damage == "truncate":
        os.truncate(weights, weights.stat().st_size // 2)
    elif damage == "flip":
        raw = bytearray(weights.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        weights.write_bytes(bytes(raw))
    elif damage == "delete":
        weights.unlink()
    else:
        (step_dir / "manifest.json").write_text('{"role": "actor", "st')
    files_before = sorted(p.name for p in step_dir.iterdir())
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(step_dir, "actor")
    assert "corrupt" in str(err.value) or "truncated" in str(err.value)
    assert sorted(p.name for p in step_dir.iterdir()) == files_before


def test_trainer_checkpoint_manifest_tensor_mismatch_refused(tmp_path):
    step_dir = save_checkpoint(tmp_path / "actor", "actor", 1, _actor_state())
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["tensors"]["embedding.weight"]["shape"] = [8, 16]
    (step_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="embedding.weight"):
        load_checkpoint(step_dir, "actor")


def test_trainer_checkpoint_bad_role_and_step_named(tmp_path):
    with pytest.raises(ValueError, match="role"):
        save_checkpoint(tmp_path, "reference", 1, _actor_state())
    with pytest.raises(ValueError, match="step"):
        save_checkpoint(tmp_path / "actor", "actor", -1, _actor_state())
    with pytest.raises(ValueError, match="weights-only"):
        save_checkpoint(tmp_path / "actor", "actor", 1, {"opt": {"lr": 1.0}})
    with pytest.raises(ValueError, match="save_every"):
        CheckpointManager.from_base(tmp_path, save_every=0)
