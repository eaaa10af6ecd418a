"""Smoke test of `t1ops export`: a campaign-layout actor checkpoint -> a directory transformers loads."""
from __future__ import annotations

import json

import pytest
import torch

from rl.model import ModelSpec, build_policy, weights_state_dict
from rl.vocab import CompactVocab
from t1ops.cli import main
from t1ops.config import parse_config
from rl.trainer.shard import Placement
from t1ops.guards.checkpoints import CheckpointManager
from t1ops.guards.sharded_checkpoints import commit, shard_dir, write_shard

MODEL = dict(num_layers=1, hidden_size=32, num_attention_heads=2, num_query_groups=1, ffn_hidden_size=32,
             num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=1024, vocab_size=248_320)


def _run_dir(tmp_path, compact: bool):
    """A run directory as `t1ops run` leaves it: config.json, vocab.json, checkpoints/actor/step_N."""
    cfg = parse_config({"model": MODEL})
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(cfg.model_dump_json())
    vocab = CompactVocab(range(100, 400), MODEL["vocab_size"]) if compact else CompactVocab.identity(MODEL["vocab_size"])
    vocab.save(run / "vocab.json")
    spec = ModelSpec(**{**MODEL, "vocab_size": vocab.size})
    state = weights_state_dict(build_policy(spec, 0))
    ckpt = CheckpointManager.from_base(run / "checkpoints")
    return ckpt.save("actor", 3, state), ckpt, state


@pytest.mark.parametrize("compact", [False, True], ids=["full-vocab", "compact-vocab"])
def test_export_command_writes_what_transformers_loads(tmp_path, capsys, compact):
    from transformers import AutoModelForCausalLM

    step_dir, _, state = _run_dir(tmp_path, compact)
    out = tmp_path / "hf"
    assert main(["export", str(step_dir), "--hf", str(out)]) == 0
    assert "exported" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert torch.equal(model.lm_head.weight, state["output_layer.weight"])
    meta = json.loads((out / "t1ops.json").read_text())
    assert meta["role"] == "actor" and meta["step"] == 3 and meta["vocab"] == ("compact" if compact else "full")
    assert (out / "tokenizer.json").is_file() != compact


def test_export_refuses_a_critic_checkpoint(tmp_path, capsys):
    step_dir, ckpt, state = _run_dir(tmp_path, compact=True)
    critic_dir = ckpt.save("critic", 3, state)
    assert main(["export", str(critic_dir), "--hf", str(tmp_path / "hf")]) == 1
    assert "CheckpointRoleError" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_export_from_shards_equals_the_one_rank_export(tmp_path, capsys):
    """The same weights saved by shard (2 ranks: row-split tensors, experts spread) and whole: the streaming
    export of each is the same Hugging Face checkpoint, tensor for tensor (tests/t1ops/test_trainer_ranks.py
    does it from a real TP = 2 + EP = 2 save)."""
    from safetensors.torch import load_file

    step_dir, _, state = _run_dir(tmp_path, compact=True)
    base = tmp_path / "run" / "checkpoints"
    sharded = shard_dir(base, "actor", 4)
    partial = sharded.with_name(".partial-" + sharded.name)
    entries = []
    for rank in (0, 1):
        where, local = {}, {}
        for i, (name, t) in enumerate(state.items()):
            if t.dim() == 2 and t.shape[0] % 2 == 0:  # a tensor-parallel slice on each rank
                where[name] = Placement(name, 0, rank, 2)
            elif i % 2 == rank:  # whole, on one rank (as experts sit on their expert-parallel rank)
                where[name] = Placement(name, None)
            else:
                continue
            local[name] = where[name].cut(t) if where[name].dim is not None else t
        entries.append(write_shard(partial, rank, where, local))
    commit(partial, sharded, "actor", 4, {"tp": 2}, entries)
    assert main(["export", str(step_dir), "--hf", str(tmp_path / "one")]) == 0
    assert main(["export", str(sharded), "--hf", str(tmp_path / "two")]) == 0
    one, two = (load_file(tmp_path / d / "model.safetensors") for d in ("one", "two"))
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    assert json.loads((tmp_path / "two" / "t1ops.json").read_text())["shards"] == 2
