"""The production trainer role on a toy model, for the scenarios that fault the trainer's own calls
(retried-train-step, critic-checkpoint-skipped)."""
from __future__ import annotations

from pathlib import Path

from rl.vocab import CompactVocab
from t1ops.campaign.trainer_host import TrainerHost
from t1ops.config import CampaignConfig, CheckpointsConfig


def tiny_trainer_host(tmp: Path, name: str, retention: CheckpointsConfig, **settings) -> TrainerHost:
    """``TrainerHost`` (a world of 1) on a 1-layer model over a 300-id vocabulary, checkpoints under
    ``tmp/name``; ``settings``: ``[trainer]`` keys over the schema's defaults."""
    cfg = CampaignConfig()
    vocab = CompactVocab(range(300), 248_320, has_unk=True)
    vocab.save(tmp / "vocab.json")
    spec = {**cfg.model.model_spec().to_dict(), "num_layers": 1, "hidden_size": 32, "ffn_hidden_size": 64,
            "moe_ffn_hidden_size": 32, "max_seq_len": 64}
    return TrainerHost(spec=spec, settings=cfg.trainer.model_copy(update=settings), vocab_path=str(tmp / "vocab.json"),
                       ckpt_base=str(tmp / name), seed=0, retention=retention)
