"""Smoke: `t1ops engine serve --openai` answers the official client and dumps an audit-clean trajectory."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from rl.engines.ports import free_port
from rl.model import ModelSpec


def test_engine_serve_openai_smoke(tmp_path):
    spec = ModelSpec(num_layers=1, hidden_size=32, num_attention_heads=2, ffn_hidden_size=32, num_experts=4,
                     moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=256)
    port = free_port()
    cli = Path(sys.executable).with_name("t1ops")
    dump = tmp_path / "dump"
    proc = subprocess.Popen([str(cli), "engine", "serve", "--openai", "--port", str(port), "--dtype", "fp32",
                             "--spec-json", json.dumps(spec.to_dict()), "--dump", str(dump)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(1200):
            assert proc.poll() is None, "t1ops engine serve --openai exited during startup"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        out = client.chat.completions.create(model="t1ops", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4, user="alice", logprobs=True)
        assert out.choices[0].finish_reason in ("length", "stop")
        assert len(out.choices[0].logprobs.content) == out.usage.completion_tokens <= 4
        with_prefix = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/s/bob/v1", api_key="x", max_retries=0)
        with_prefix.chat.completions.create(model="t1ops", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        chunks = list(with_prefix.chat.completions.create(
            model="t1ops", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True,
            stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
        assert chunks[-1].usage.completion_tokens <= 2
        # bob's second request follows a truncated reply: a new chunk of the same trajectory (split)
        assert sorted(p.name for p in dump.glob("*.npz")) == ["alice.c0.npz", "bob.c0.npz", "bob.c1.npz"]
        audit = subprocess.run([str(cli), "audit", str(dump), "--json"], capture_output=True, text=True, timeout=120)
        assert audit.returncode == 0, audit.stderr
        assert json.loads(audit.stdout)["drift_in_loss"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
