"""`[model] path`: the checkpoint's config.json decides the architecture and the shape; a contradicting
hand-typed field and a broken directory are refused at load, naming the key or the file; `t1ops model
init` writes the checkpoint through transformers' own save_pretrained, and a trainer started from it
holds the checkpoint's weights (actor) and trunk (critic, with a fresh value head)."""
import json

import pytest
import torch

from rl.hf.reader import HFCheckpoint
from rl.model import weights_state_dict
from rl.vocab import CompactVocab
from t1ops.commands.model import init_checkpoint
from t1ops.config import load_toml
from t1ops.errors import ConfigError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return init_checkpoint("qwen3_5_moe", str(tmp_path_factory.mktemp("m") / "ckpt"), vocab_size=320, max_seq_len=512)


def _cfg(tmp_path, model: str):
    f = tmp_path / "c.toml"
    f.write_text(f"[model]\n{model}\n[rollout]\ncontext_window = 256\n")
    return load_toml(f)


def test_path_fills_the_shape_from_config_json(ckpt, tmp_path):
    cfg = _cfg(tmp_path, f'path = "{ckpt}"')
    spec = cfg.model.model_spec()
    assert spec.arch == "qwen3_5_moe" and spec.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert (cfg.model.num_layers, cfg.model.vocab_size, cfg.model.max_seq_len) == (4, 320, 512)
    assert json.loads(open(ckpt + "/config.json").read())["model_type"] == "qwen3_5_moe_text"


def test_a_contradicting_shape_field_and_a_bad_directory_are_refused(ckpt, tmp_path):
    with pytest.raises(ConfigError, match=r"remove model.num_layers = 2 \(checkpoint: 4\)"):
        _cfg(tmp_path, f'path = "{ckpt}"\nnum_layers = 2')
    with pytest.raises(ConfigError, match="model.path"):
        _cfg(tmp_path, f'path = "{tmp_path}"')


def test_trainer_starts_from_the_checkpoint(ckpt):
    from rl.trainer import Trainer, TrainerSettings
    from t1ops.campaign.pretrained import pretrained_states

    checkpoint = HFCheckpoint(ckpt)
    vocab = CompactVocab(range(0, 300, 3), 320)  # a compact vocabulary: the checkpoint's rows of its ids
    spec = type(checkpoint.spec)(**{**checkpoint.spec.to_dict(), "vocab_size": vocab.size})
    trainer = Trainer(spec, TrainerSettings(mode="ppo"), seed=5, unk_id=vocab.unk_id)
    actor, critic = pretrained_states(ckpt, vocab, with_critic=True)
    trainer.warm_load(actor_state=actor, critic_state=critic)
    full = checkpoint.mcore_state()
    got = weights_state_dict(trainer.actor)
    assert torch.equal(got["decoder.layers.0.self_attention.in_proj.weight"],
                       full["decoder.layers.0.self_attention.in_proj.weight"])
    assert torch.equal(got["output_layer.weight"][:vocab.num_known], full["output_layer.weight"][0:300:3])
    crit = weights_state_dict(trainer.critic)
    assert torch.equal(crit["decoder.layers.3.self_attention.linear_qkv.weight"],
                       full["decoder.layers.3.self_attention.linear_qkv.weight"])
    assert not crit["output_layer.weight"].any()  # a fresh value head


def test_a_compact_export_starts_a_run_bit_identically(ckpt, tmp_path):
    """A warm start exported with its compact vocabulary (`t1ops export`'s t1ops.json) is a [model] path:
    the run takes its ids, and the trainer holds exactly the exported weights (not re-initialised)."""
    from rl.hf.checkpoint import export_hf, export_vocab
    from rl.trainer import Trainer, TrainerSettings
    from t1ops.campaign.pretrained import pretrained_states

    spec = HFCheckpoint(ckpt).spec
    vocab = CompactVocab(range(0, 300, 3), 320)
    compact = type(spec)(**{**spec.to_dict(), "vocab_size": vocab.size})
    warm = Trainer(compact, TrainerSettings(mode="grpo"), seed=1, unk_id=vocab.unk_id)
    export_hf(weights_state_dict(warm.actor), compact, tmp_path / "warm", tokenizer=False,
              meta={"role": "actor", "vocab": "compact", "compact_vocab": vocab.to_dict()})
    assert export_vocab(tmp_path / "warm") == vocab
    fresh = Trainer(compact, TrainerSettings(mode="grpo"), seed=9, unk_id=vocab.unk_id)
    fresh.warm_load(actor_state=pretrained_states(str(tmp_path / "warm"), vocab, with_critic=False)[0])
    mine, theirs = weights_state_dict(fresh.actor), weights_state_dict(warm.actor)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    with pytest.raises(Exception, match="another compact vocabulary"):
        pretrained_states(str(tmp_path / "warm"), CompactVocab(range(0, 200, 2), 320), with_critic=False)


def test_a_checkpoint_with_another_tokenizer_is_refused(tmp_path):
    """A Qwen3 tokenizer (<|im_end|> = 151645) beside the weights: trajectories rendered with the Qwen3.5
    tokenizer would train its rows on ids that mean other tokens."""
    from rl.errors import CheckpointError
    from rl.hf.tokenizer import check_renderer_tokenizer

    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": [
        {"id": 151643, "content": "<|endoftext|>"}, {"id": 151644, "content": "<|im_start|>"},
        {"id": 151645, "content": "<|im_end|>"}]}))
    with pytest.raises(CheckpointError, match=r"<\|endoftext\|> is id 151643, but t1ops renders chats"):
        check_renderer_tokenizer(tmp_path)
    check_renderer_tokenizer(tmp_path / "absent")  # no tokenizer.json: a compact export, its ids in t1ops.json
