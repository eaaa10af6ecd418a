"""Export a t1ops actor checkpoint as a Hugging Face directory (``t1ops export``), streaming.

The checkpoint, whole (a world of 1) or by shard (one file per rank), is verified (role ``actor``,
sha256) and read lazily by :class:`t1ops.guards.sharded_checkpoints.CheckpointReader`: each Hugging
Face tensor is assembled from the shards when its turn comes and written at once
(``rl.hf.checkpoint.export_hf``), so the export holds about one tensor, never the model;
the model shape comes from the run's ``config.json`` (``<run>/checkpoints/actor/step_N`` ->
``<run>/config.json``) or an explicit campaign TOML / config.json; a compact-vocabulary run's
``vocab.json`` is carried into ``t1ops.json`` (``rl.hf.checkpoint`` explains why such an export
has no tokenizer files).
"""
from __future__ import annotations

import json
from pathlib import Path

from t1ops.config import CampaignConfig, load_toml, parse_config
from t1ops.errors import ConfigError


def _campaign_config(step_dir: Path, config: str | None) -> tuple[CampaignConfig, Path | None]:
    if config is None:
        run_dir = step_dir.resolve().parents[2]
        path = run_dir / "config.json"
        if not path.is_file():
            raise ConfigError(f"{step_dir} is not inside a run directory with config.json ({path} missing); "
                              "pass --config with the campaign TOML that trained it", path=str(path))
        return parse_config(json.loads(path.read_text()), source=str(path)), run_dir
    if config.endswith(".json"):
        return parse_config(json.loads(Path(config).read_text()), source=config), Path(config).parent
    return load_toml(config), None


def export_actor_checkpoint(step_dir: str | Path, out_dir: str | Path, *, config: str | None = None,
                            dtype: str = "float32") -> Path:
    """Verify ``step_dir`` and write its Hugging Face export to ``out_dir``; return ``out_dir``."""
    from rl.hf.checkpoint import export_hf
    from rl.model import ModelSpec
    from rl.vocab import CompactVocab
    from t1ops.guards.sharded_checkpoints import CheckpointReader

    step_dir = Path(step_dir)
    state = CheckpointReader(step_dir, "actor")
    cfg, run_dir = _campaign_config(step_dir, config)
    spec = cfg.model.model_spec()
    vocab_size = state.shape("embedding.word_embeddings.weight")[0]
    meta = {"role": "actor", "step": state.step, "source": str(step_dir.resolve()), "vocab": "full",
            "shards": len(state.manifest.get("shards", [None]))}
    full = vocab_size == spec.vocab_size
    if not full:
        vocab_path = run_dir / "vocab.json" if run_dir is not None else None
        if vocab_path is None or not vocab_path.is_file():
            raise ConfigError(f"{step_dir} holds {vocab_size} vocabulary rows, the config says {spec.vocab_size}, and "
                              "no run vocab.json explains it; pass the run's config.json as --config",
                              path=str(step_dir))
        vocab = CompactVocab.load(vocab_path)
        if vocab.size != vocab_size:
            raise ConfigError(f"{vocab_path} has {vocab.size} compact ids, the checkpoint {vocab_size} rows",
                              path=str(vocab_path))
        meta.update(vocab="compact", compact_vocab=vocab.to_dict())
        spec = ModelSpec(**{**spec.to_dict(), "vocab_size": vocab_size})
    return export_hf(state, spec, out_dir, dtype=dtype, meta=meta, tokenizer=full)
