"""`t1ops preflight PLAN --model DIR`: the plan's model from a checkpoint's config.json. A config.json of
Qwen3.5-122B-A10B's shape gives the same memory prediction and verdict as the plan's built-in model of
the report (the defaults of t1ops.preflight.plan.ModelShape); a pattern the memory model cannot describe
is refused by name."""
import json
import subprocess
import sys

import pytest

from t1ops.errors import ConfigError
from t1ops.preflight.from_checkpoint import model_shape

QWEN35_122B = {"model_type": "qwen3_5_moe", "text_config": {
    "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 3072, "num_hidden_layers": 48,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 12, "num_attention_heads": 32,
    "num_key_value_heads": 2, "head_dim": 256, "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 1024,
    "num_experts": 256, "num_experts_per_tok": 8, "linear_num_key_heads": 16, "linear_num_value_heads": 64,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                                           "partial_rotary_factor": 0.25}}}


def _preflight(*extra):
    out = subprocess.run([sys.executable, "-m", "t1ops.cli", "preflight", "examples/plans/qwen35-122b-128gpu-cp4.toml",
                          "--json", *extra], capture_output=True, text=True, timeout=120)
    return out.returncode, json.loads(out.stdout)


def test_a_122b_config_json_predicts_what_the_plans_report_model_does(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN35_122B))
    code, from_dir = _preflight("--model", str(tmp_path))
    ref_code, ref = _preflight()
    assert (code, from_dir["verdict"]) == (ref_code, ref["verdict"])
    assert from_dir["memory"] == ref["memory"]


def test_a_pattern_the_memory_model_cannot_describe_is_refused(tmp_path):
    config = json.loads(json.dumps(QWEN35_122B))
    config["text_config"]["layer_types"][0] = "full_attention"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="not 'every Nth layer full attention'"):
        model_shape(tmp_path)
