"""Smoke test of `t1ops engine serve --model-path`: a Hugging Face export served like SGLang's --model-path."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from rl.engines.ports import free_port
from rl.hf.checkpoint import export_hf
from rl.model import ModelSpec, build_policy, weights_state_dict

REPO = Path(__file__).resolve().parents[2]
SPEC = ModelSpec(num_layers=1, hidden_size=32, num_attention_heads=2, num_query_groups=1, ffn_hidden_size=32,
                 num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=64, vocab_size=256)


def test_serve_loads_a_hugging_face_dir_and_reloads_it_from_disk(tmp_path):
    export_hf(weights_state_dict(build_policy(SPEC, 0)), SPEC, tmp_path / "hf", tokenizer=False, meta={"role": "actor"})
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "t1ops.cli", "engine", "serve", "--model-path", str(tmp_path / "hf"),
                             "--port", str(port), "--dtype", "fp32"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        info = httpx.get(url + "/model_info", timeout=10).json()
        assert info["weight_version"] == "default" and info["spec"]["vocab_size"] == 256
        resp = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "hf"),
                                                                  "weight_version": "7"}, timeout=60)
        assert resp.status_code == 200 and resp.json()["success"]
        assert httpx.get(url + "/model_info", timeout=10).json()["weight_version"] == "7"
    finally:
        proc.kill()
        proc.wait()
