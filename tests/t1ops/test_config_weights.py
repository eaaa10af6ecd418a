"""Config rules of the weight path: full vocabulary with SGLang servers, GQA shape, sync modes."""
from __future__ import annotations

from pathlib import Path

import pytest

from t1ops.config import load_toml, parse_config
from t1ops.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SGLANG = {"kind": "sglang", "num_engines": 1, "urls": ["http://127.0.0.1:30000"]}


def test_sglang_engines_need_the_full_vocabulary():
    with pytest.raises(ConfigError, match="compact_vocab = false"):
        parse_config({"engine": SGLANG})
    cfg = parse_config({"engine": {**SGLANG, "weight_sync": "distributed", "compact_vocab": False}})
    assert cfg.engine.weight_sync == "distributed" and cfg.engine.weight_sync_backend is None


def test_query_groups_must_divide_heads_and_sync_mode_is_checked():
    with pytest.raises(ConfigError, match="num_query_groups"):
        parse_config({"model": {"num_attention_heads": 4, "num_query_groups": 3}})
    with pytest.raises(ConfigError, match="weight_sync"):
        parse_config({"engine": {"weight_sync": "rsync"}})


def test_shipped_sglang_example_is_valid():
    cfg = load_toml(REPO / "examples" / "sglang" / "campaign.toml")
    assert cfg.engine.kind == "sglang" and not cfg.engine.compact_vocab and cfg.engine.weight_sync == "distributed"
