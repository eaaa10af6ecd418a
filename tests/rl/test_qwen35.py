"""The documents' model from a checkpoint: megatron-core against ``transformers`` on the same weights.

A checkpoint written by ``transformers``' own ``save_pretrained`` (Qwen3.5-MoE: GatedDeltaNet and
gated attention layers, partial RoPE, zero-centred norms, a gated shared expert; Qwen3-MoE with
head_dim != hidden / heads) is read by ``rl.hf.reader``, built on megatron-core (``rl.model``), and its
fp32 logits equal ``transformers``' within 1e-4 (the max printed). The export of the trained policy
loads back into ``transformers`` with the trainer's logits. Every bad input is one line naming the
file and the tensor. Multi-rank equality (tp = 2 + ep = 2, dp = 2): tests/t1ops/test_trainer_ranks.py.
"""
from __future__ import annotations

import json

import pytest
import torch

from rl.errors import CheckpointError
from rl.hf.checkpoint import export_hf
from rl.hf.reader import HFCheckpoint
from rl.model import build_policy, load_state, policy_forward, record_routing, weights_state_dict
from tests.rl.hf_models import hf_logits, hf_model, write_checkpoint

LOGIT_ATOL = 1e-4
IDS = torch.randint(0, 320, (2, 80), generator=torch.Generator().manual_seed(1))  # > one 64-token GDN chunk


def _trainer_model(path):
    ckpt = HFCheckpoint(path)
    policy = build_policy(ckpt.spec, seed=0)
    load_state(policy, ckpt.mcore_state(), source=str(path))
    return ckpt, policy.eval()


@pytest.mark.parametrize("arch", ["qwen3_5_moe", "qwen3_moe"])
def test_trainer_logits_equal_transformers(arch, tmp_path):
    hf = hf_model(arch)
    hf.save_pretrained(tmp_path / "ckpt")
    ckpt, policy = _trainer_model(tmp_path / "ckpt")
    assert ckpt.spec.arch == arch
    with torch.no_grad(), record_routing(policy) as rec:
        mine = policy_forward(policy, IDS).float()
    err = float((mine - hf_logits(hf, IDS)).abs().max())
    print(f"{arch}: max |logit difference| megatron vs transformers (fp32, 1 rank): {err:.3e}")
    assert err <= LOGIT_ATOL
    assert mine.std() > 0.1
    # R3's rows: one per MoE layer (every layer), derived from the checkpoint
    assert rec.rows[0].shape == (IDS.shape[1], ckpt.spec.num_layers, ckpt.spec.moe_router_topk)


def test_the_reports_routing_row_bytes_from_the_checkpoint_config():
    """48 MoE layers x top-8 x 4 bytes = the report's 1,536 bytes per token, from a 122B-shaped config."""
    from rl.hf.layout import spec_from_config

    config = {"model_type": "qwen3_5_moe", "text_config": {
        "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 3072, "num_hidden_layers": 48,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 12, "num_attention_heads": 32,
        "num_key_value_heads": 2, "head_dim": 256, "moe_intermediate_size": 1024,
        "shared_expert_intermediate_size": 1024, "num_experts": 256, "num_experts_per_tok": 8,
        "linear_num_key_heads": 16, "linear_num_value_heads": 64, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}}}
    spec = spec_from_config(config)
    assert spec.layer_types.count("linear_attention") == 36 and spec.num_moe_layers == 48
    assert spec.num_moe_layers * spec.moe_router_topk * 4 == 1536


def test_checkpoint_ppo_step_export_round_trip(tmp_path):
    """checkpoint -> t1ops -> one PPO step -> export -> transformers loads it with the trainer's logits."""
    from transformers import AutoModelForCausalLM

    from rl.trainer import Trainer, TrainerSettings, rollout_batch, sample_responses
    from t1ops.campaign.pretrained import pretrained_states
    from rl.vocab import CompactVocab

    path = write_checkpoint("qwen3_5_moe", tmp_path / "ckpt")
    spec = HFCheckpoint(path).spec
    trainer = Trainer(spec, TrainerSettings(mode="ppo", ppo_epochs=1, actor_lr=1e-3), seed=0)
    actor, critic = pretrained_states(str(path), CompactVocab.identity(spec.vocab_size), with_critic=True)
    trainer.warm_load(actor_state=actor, critic_state=critic)
    before = {k: v.clone() for k, v in weights_state_dict(trainer.actor).items()}
    seqs = sample_responses(trainer.actor, [[1, 2, 3, 4]] * 4, 8, generator=torch.Generator().manual_seed(0))
    batch = rollout_batch(trainer.actor, seqs, [4] * 4, [0.0, 1.0, 0.5, 0.2], [0, 0, 1, 1], [0, 0, 1, 1])
    trainer.train_step(batch)
    after = weights_state_dict(trainer.actor)
    assert any(not torch.equal(before[k], after[k]) for k in after)  # the step moved the weights
    export_hf(after, spec, tmp_path / "out", tokenizer=False, meta={"role": "actor"})
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert type(back).__name__ == "Qwen3_5MoeForCausalLM"
    with torch.no_grad():
        err = float((policy_forward(trainer.actor.eval(), IDS).float() - hf_logits(back, IDS)).abs().max())
    print(f"checkpoint -> PPO step -> export -> transformers: max |logit difference| {err:.3e}")
    assert err <= LOGIT_ATOL


def test_multimodal_wrapper_names_and_mtp_are_read_and_set_aside(tmp_path):
    """Released Qwen3.5 checkpoints nest the text model under model.language_model and carry mtp.* layers."""
    from safetensors.torch import load_file, save_file

    path = write_checkpoint("qwen3_5_moe", tmp_path / "ckpt")
    tensors = load_file(str(path / "model.safetensors"))
    renamed = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
               for k, v in tensors.items()}
    renamed["mtp.fc.weight"] = torch.zeros(4, 4)
    (path / "model.safetensors").unlink()
    half = sorted(renamed)
    save_file({k: renamed[k] for k in half[:40]}, str(path / "model-00001-of-00002.safetensors"))
    save_file({k: renamed[k] for k in half[40:]}, str(path / "model-00002-of-00002.safetensors"))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        k: f"model-0000{1 + (i >= 40)}-of-00002.safetensors" for i, k in enumerate(half)}}))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": config}))
    ckpt = HFCheckpoint(path)
    assert ckpt.set_aside == ["mtp.fc.weight"]
    assert torch.equal(ckpt.mcore_state()["output_layer.weight"], tensors["lm_head.weight"])


# --- bad input: one line naming the file and the tensor, nothing half-loaded -----------------------
def _shard_pair(tmp_path):
    from safetensors.torch import load_file, save_file

    path = write_checkpoint("qwen3_5_moe", tmp_path / "ckpt")
    tensors = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[:50]}, str(path / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in names[50:]}, str(path / "model-00002-of-00002.safetensors"))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        k: f"model-0000{1 + (i >= 50)}-of-00002.safetensors" for i, k in enumerate(names)}}))
    return path, tensors


def test_missing_shard_is_named(tmp_path):
    path, _ = _shard_pair(tmp_path)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002.safetensors is missing: .* puts model\."):
        HFCheckpoint(path)


def test_truncated_shard_is_named(tmp_path):
    path, _ = _shard_pair(tmp_path)
    shard = path / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"cannot read .*model-00001-of-00002.safetensors.*truncated"):
        HFCheckpoint(path)


@pytest.mark.parametrize("bad", ["shape", "dtype", "missing", "unknown"])
def test_a_wrong_tensor_is_named(bad, tmp_path):
    from safetensors.torch import load_file, save_file

    path = write_checkpoint("qwen3_5_moe", tmp_path / "ckpt")
    tensors = load_file(str(path / "model.safetensors"))
    name = "model.layers.0.linear_attn.in_proj_z.weight"
    if bad == "shape":
        tensors[name] = tensors[name][:-1]
    elif bad == "dtype":
        tensors[name] = tensors[name].to(torch.int32)
    elif bad == "missing":
        del tensors[name]
    else:
        tensors["model.layers.0.linear_attn.in_proj_qkvz.weight"] = tensors[name].clone()
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="in_proj_(z|qkvz)"):
        HFCheckpoint(path)


def test_unsupported_architecture_and_tokenizer_mismatch(tmp_path):
    path = write_checkpoint("qwen3_5_moe", tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match="model_type 'llama' is not supported; t1ops trains"):
        HFCheckpoint(path)
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 5000}}, "added_tokens": []}))
    with pytest.raises(CheckpointError, match="token id 5000 but config.json's vocab_size is 320"):
        HFCheckpoint(path)
