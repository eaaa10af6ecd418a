"""A real embedded engine process on loopback, driven through the SGLang client."""
from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest
import torch

from rl.engines.client import EngineClient
from rl.engines.embedded_spawn import spawn
from rl.engines.ports import free_port
from rl.engines.protocol import GenerateRequest, SamplingParams
from rl.errors import EngineError
from rl.model import (
    ModelSpec, build_critic, build_policy, last_logits, load_state, record_routing, token_logprobs,
    weights_state_dict,
)
from rl.vocab import CompactVocab
from t1ops.guards.checkpoints import save_checkpoint

IM_START = 248045
VOCAB = CompactVocab(list(range(100, 140)) + [IM_START], 248_320)
SPEC = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, num_experts=8,
                 moe_router_topk=2, moe_ffn_hidden_size=64, max_seq_len=160, vocab_size=VOCAB.size)
PROMPT = (IM_START, 101, 105, 999_999 % 248_320, 110, 120)  # 999_999 % V is outside the subset: UNK input


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    VOCAB.save(root / "vocab.json")
    trainer = build_policy(SPEC, seed=0, unk_id=VOCAB.unk_id)
    step1 = save_checkpoint(root / "actor", "actor", 1, weights_state_dict(trainer))
    port = free_port()
    proc = spawn(port, SPEC, checkpoint=step1, vocab_path=root / "vocab.json", dtype="bf16",
                 log_path=root / "engine.log")
    http = httpx.Client(timeout=60.0)
    client = EngineClient(proc.url, http, num_moe_layers=SPEC.num_layers, topk=SPEC.moe_router_topk,
                          num_experts=SPEC.num_experts)
    yield {"root": root, "trainer": trainer, "step1": step1, "client": client, "http": http, "url": proc.url}
    http.close()
    proc.terminate()
    proc.wait(timeout=30)


def _request(max_new_tokens: int, **kwargs) -> GenerateRequest:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, sampling_seed=7)
    return GenerateRequest(input_ids=PROMPT, sampling_params=params, return_logprob=True, **kwargs)


def test_generate_logprobs_and_routing_match_a_direct_forward(setup) -> None:
    client = setup["client"]
    assert client.health() and client.health_generate()
    assert client.weight_version() == "1"  # the manifest's step
    response = client.generate(_request(6, return_routed_experts=True))
    num_out = len(response.output_ids)
    assert response.finish_reason.type == "length" and num_out == 6
    assert set(response.output_ids) <= set(VOCAB.decode(range(VOCAB.num_known)))
    assert response.routed_experts_RLK.shape == (len(PROMPT) + num_out - 1, SPEC.num_layers, SPEC.moe_router_topk)

    # Same weights, same precision, same per-step shapes as the engine: exact.
    engine_twin = build_policy(SPEC, seed=3, dtype=torch.bfloat16, unk_id=VOCAB.unk_id)
    load_state(engine_twin, weights_state_dict(setup["trainer"]))
    ids = VOCAB.encode_inputs(PROMPT) + VOCAB.encode_targets(response.output_ids)
    expected_lp, expected_rows = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the engine runs one intra-op thread; reductions then match bit for bit
    try:
        for step in range(num_out):
            with torch.no_grad(), record_routing(engine_twin) as record:
                logits_V = last_logits(engine_twin, torch.tensor([ids[: len(PROMPT) + step]]))[0]
            expected_lp.append(float(torch.log_softmax(logits_V, -1)[ids[len(PROMPT) + step]]))
            expected_rows.extend(record.rows[0] if step == 0 else record.rows[0][-1:])
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_allclose(response.output_token_logprobs, expected_lp, rtol=0, atol=1e-6)
    assert np.array_equal(response.routed_experts_RLK, np.stack(expected_rows))

    # The fp32 trainer sees the same tokens slightly differently (bf16 vs fp32).
    with torch.no_grad():
        trainer_lp = token_logprobs(setup["trainer"], torch.tensor([ids[:-1]]), torch.tensor([ids[1:]]))[0, -num_out:]
    gap = np.abs(np.asarray(response.output_token_logprobs) - trainer_lp.numpy())
    print(f"engine bf16 vs trainer fp32: max |dlogprob| {gap.max():.4g}")
    assert gap.max() < 0.1

    # routed_experts_start_len trims leading rows as SGLang does.
    trimmed = client.generate(_request(6, return_routed_experts=True, routed_experts_start_len=4))
    assert trimmed.output_ids == response.output_ids  # same sampling_seed
    assert np.array_equal(trimmed.routed_experts_RLK, response.routed_experts_RLK[4:])


def _generate_in_background(client, request):
    box = {}
    thread = threading.Thread(target=lambda: box.update(response=client.generate(request)), daemon=True)
    thread.start()
    return thread, box


def _model_info(http, url) -> dict:
    return http.get(url + "/model_info").json()


def _wait_generating(http, url, tokens_before: int, timeout_s: float = 60.0) -> None:
    """Until the engine has sampled a token past ``tokens_before``: the request is running *and* has
    output. ``num_running_requests`` alone counts a request from its arrival, before its first
    forward; a pause landing in that gap leaves no token under the old version (the flake of
    test_pause_quiesces_and_update_changes_version under a busy core)."""
    deadline = time.monotonic() + timeout_s  # a deadline, not a poll count: a loaded host answers slowly
    while time.monotonic() < deadline:
        info = _model_info(http, url)
        if info["num_running_requests"] >= 1 and info["num_generated_tokens"] > tokens_before:
            return
        time.sleep(0.005)
    raise AssertionError(f"no token generated within {timeout_s} s")


def test_pause_quiesces_and_update_changes_version(setup, tmp_path) -> None:
    client, http, url = setup["client"], setup["http"], setup["url"]
    request = _request(SPEC.max_seq_len - len(PROMPT))  # the longest the window allows: most time to pause in
    before = _model_info(http, url)["num_generated_tokens"]
    thread, box = _generate_in_background(client, request)
    _wait_generating(http, url, before)
    client.pause_generation("in_place")
    paused_at = _model_info(http, url)["num_generated_tokens"] - before
    time.sleep(0.5)
    assert thread.is_alive(), f"a paused engine finished a {request.sampling_params.max_new_tokens}-token generation"
    assert _model_info(http, url)["num_generated_tokens"] - before == paused_at, "tokens sampled while paused"
    assert not client.flush_cache()  # refused while a request is in flight

    critic_dir = save_checkpoint(tmp_path / "critic", "critic", 2, weights_state_dict(build_critic(SPEC, seed=1)))
    with pytest.raises(EngineError, match="not 'actor'"):
        client.update_weights_from_disk(str(critic_dir), "2")
    assert client.weight_version() == "1"
    step2 = save_checkpoint(tmp_path / "actor", "actor", 2, weights_state_dict(build_policy(SPEC, seed=1, unk_id=VOCAB.unk_id)))
    client.update_weights_from_disk(str(step2), "2")
    assert client.weight_version() == "2"

    client.continue_generation()
    thread.join(timeout=120)
    response = box["response"]
    num_new = request.sampling_params.max_new_tokens
    assert response.finish_reason.type == "length" and len(response.output_ids) == num_new
    # Frozen mid-generation: tokens before the pause came from "1", after it from "2".
    assert response.spans_versions and [s.version for s in response.weight_versions] == ["1", "2"]
    assert response.weight_versions[0].end == paused_at
    assert response.weight_version == "2"
    client.update_weights_from_disk(str(setup["step1"]), "1")


def test_pause_abort_and_abort_request(setup) -> None:
    client, http, url = setup["client"], setup["http"], setup["url"]
    before = _model_info(http, url)["num_generated_tokens"]
    thread, box = _generate_in_background(client, _request(120))
    _wait_generating(http, url, before)
    client.pause_generation("abort")
    thread.join(timeout=30)
    assert box["response"].finish_reason.type == "abort"
    assert len(box["response"].output_ids) < 120
    client.continue_generation()

    before = _model_info(http, url)["num_generated_tokens"]
    thread, box = _generate_in_background(client, _request(120, rid="r-17"))
    _wait_generating(http, url, before)
    client.abort_request("r-17")
    thread.join(timeout=30)
    assert box["response"].finish_reason.type == "abort"
    assert client.flush_cache()


def test_over_budget_request_is_refused(setup) -> None:
    resp = setup["http"].post(setup["url"] + "/generate", json=_request(SPEC.max_seq_len).to_json())
    assert resp.status_code == 400 and "context window" in resp.json()["error"]["message"]


@pytest.mark.slow
def test_cli_serve_smoke() -> None:
    """`t1ops engine serve` starts a healthy fp32 engine with a random init."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    spec = ModelSpec(num_layers=1, hidden_size=32, num_attention_heads=2, ffn_hidden_size=32, num_experts=4,
                     moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=32, vocab_size=300)
    port = free_port()
    cli = Path(sys.executable).with_name("t1ops")  # the console script installed with the package
    command = [str(cli), "engine", "serve", "--port", str(port), "--dtype", "fp32",
               "--spec-json", json.dumps(spec.to_dict())]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(1200):
            assert proc.poll() is None, "t1ops engine serve exited during startup"
            try:
                info = httpx.get(url + "/model_info", timeout=2.0).json()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert info["dtype"] == "float32" and info["spec"]["vocab_size"] == 300
        assert info["weight_version"] == "default"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_chaos_fault_switch_needs_chaos_mode() -> None:
    """--chaos-omit-routing-for (the missing-routing scenario's fault) is refused without --chaos;
    with it, the engine omits routing for matching rids only."""
    import argparse

    from rl.engines import embedded
    from rl.errors import InputError

    parser = argparse.ArgumentParser()
    embedded.add_serve_arguments(parser)
    args = parser.parse_args(["--port", "1", "--chaos-omit-routing-for=-t1$"])
    with pytest.raises(InputError, match="add --chaos"):
        embedded.build_engine(args)
    args = parser.parse_args(["--port", "1", "--chaos", "--chaos-omit-routing-for", "(", "--recompute"])
    with pytest.raises(InputError, match="not a regular expression"):
        embedded.build_engine(args)
    engine = embedded.build_engine(parser.parse_args(
        ["--port", "1", "--chaos", "--chaos-omit-routing-for=-s1-t0$", "--recompute",
         "--spec-json", '{"vocab_size": 512, "max_seq_len": 64}']))
    for rid, has_routing in (("g0-s1-t0", False), ("g0-s0-t0", True)):
        req = GenerateRequest(input_ids=(1, 2, 3), rid=rid, return_routed_experts=True,
                              sampling_params=SamplingParams(max_new_tokens=2, sampling_seed=1))
        assert (engine.generate(req).routed_experts_RLK is not None) == has_routing
