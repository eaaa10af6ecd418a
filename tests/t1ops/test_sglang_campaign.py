"""The real-server path end to end: `engine.kind = "sglang"` against engines reached only by URL.

The engines are `t1ops engine serve --model-path HF_DIR` processes (a Hugging Face export, full
vocabulary, SGLang's endpoints), started before the campaign and unknown to it except by URL,
as real SGLang servers would be. Weights move by `distributed` sync: the trainer (rank 0 of a
gloo group) broadcasts into both engines at start-up and after every step.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rl.engines.ports import free_port
from rl.hf.checkpoint import export_hf
from rl.model import ModelSpec, build_policy, weights_state_dict
from t1ops.config import load_toml

REPO = Path(__file__).resolve().parents[2]


def _serve(model_path: Path, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "t1ops.cli", "engine", "serve", "--model-path", str(model_path),
                             "--port", str(port), "--dtype", "bf16"], stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"engine on {port} never became healthy: {log.read_text()[-2000:]}")


@pytest.fixture
def url_engines(tmp_path):
    cfg = load_toml(REPO / "examples" / "sglang" / "campaign.toml")
    spec = ModelSpec.from_config(cfg.model)
    export_hf(weights_state_dict(build_policy(spec, seed=123)), spec, tmp_path / "served", tokenizer=False,
              meta={"role": "actor"})  # what the operator started the servers on (not the trainer's weights)
    ports = [free_port(), free_port()]
    procs = [_serve(tmp_path / "served", port, tmp_path / f"engine{i}.log") for i, port in enumerate(ports)]
    yield cfg, [f"http://127.0.0.1:{p}" for p in ports]
    for p in procs:
        p.kill()
        p.wait()


@pytest.mark.slow
def test_campaign_against_url_engines_with_distributed_sync(tmp_path, url_engines):
    from t1ops.campaign.launch import run_campaign

    cfg, urls = url_engines
    cfg.engine.urls = urls
    cfg.run.steps = 2
    cfg.run.num_cpus = 2
    cfg.rollout.batch_size = 4
    cfg.rollout.n_samples_per_prompt = 2
    cfg.rollout.max_turns = 1
    cfg.rollout.max_new_tokens = 16
    cfg.rollout.tasks_dir = str(REPO / "examples" / "tasks")
    # no supervised warm start: its two steps were two thirds of this test's CPU (a full-vocabulary head, 248,320
    # rows), and what is checked here is the servers' path, not what the policy learns
    cfg.trainer.warm_start_steps = 0
    cfg.trainer.ppo_epochs = 1
    cfg.engine.weight_sync_backend = "gloo"  # the engines run on CPU (a real SGLang server: nccl, the default)
    assert cfg.engine.kind == "sglang" and cfg.engine.weight_sync == "distributed" and not cfg.engine.compact_vocab
    run_dir = run_campaign(cfg, out_dir=str(tmp_path / "runs"), show_progress=False)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [1, 2]
    assert all(s["num_trajectories"] == 4 and s["engines_dead"] == [] for s in summary["steps"])
    for url in urls:  # both engines serve the trainer's last published version
        assert httpx.get(url + "/model_info", timeout=10).json()["weight_version"] == "2"
    vocab = json.loads((run_dir / "vocab.json").read_text())
    assert vocab["identity"] and vocab["full_vocab_size"] == cfg.model.vocab_size
    def events(role: str) -> list[dict]:
        return [json.loads(line) for line in (run_dir / "telemetry" / role / "events.jsonl").read_text().splitlines()]

    # the trainer pushes inside the coordinator's barrier (docs/weights.md, "One transaction"): it forms the group
    groups = [e for e in events("trainer") if e["name"] == "engine.weight_group"]
    assert len(groups) == 1 and groups[0]["world_size"] == 3 and groups[0]["failed"] == 0  # formed once, reused
    events = events("router")
    assert not any(e["name"] == "engine.weight_group" for e in events)  # the router never moves weights
    assert sum(e["name"] == "engine.admitted" for e in events) == 2
