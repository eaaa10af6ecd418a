"""The K/V-cache engine with continuous batching equals the recompute path.

Exactness (fp32 engines, greedy): the same output ids, the same routed experts
for every returned position, and log-probs within 1e-5 (the cached forward sums
attention in another order than the full forward: observed differences are
below 1e-6). Concurrent multi-turn trajectories, prefix reuse across turns and
across a group's shared prompt, a weight update between turns, pause/abort.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from rl.engines import protocol as P
from rl.engines import protocol_control as PC
from rl.engines.background import EngineFailedError
from rl.engines.embedded_engine import EmbeddedEngine
from rl.model import ModelSpec, save_weights, build_policy
from rl.vocab import CompactVocab

LOGPROB_TOL = 1e-5
SPEC = ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_experts=8,
                 moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=192, vocab_size=300)
STOP = 5


def write_checkpoint(directory, seed: int, qkv_gain: float = 1.0):
    """An actor checkpoint; ``qkv_gain`` sharpens attention (a random init attends almost uniformly,
    which would hide errors in the cached attention)."""
    import hashlib
    import json

    model = build_policy(SPEC, seed=seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "linear_qkv" in name:
                param.mul_(qkv_gain)
    path = save_weights(model, directory)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (directory / "manifest.json").write_text(json.dumps({"role": "actor", "file_sha256": digest, "step": 1}))
    return str(directory)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    vocab = CompactVocab.identity(SPEC.vocab_size)
    ckpt = write_checkpoint(tmp_path_factory.mktemp("sharp"), seed=0, qkv_gain=6.0)
    new = EmbeddedEngine(SPEC, vocab, torch.float32, 0, checkpoint=ckpt)
    old = EmbeddedEngine(SPEC, vocab, torch.float32, 0, checkpoint=ckpt, batching=False)
    return new, old


def request(ids, start=0, max_new=10):
    params = P.SamplingParams(max_new_tokens=max_new, temperature=0.0, stop_token_ids=(STOP,))
    return P.GenerateRequest(input_ids=tuple(ids), sampling_params=params, return_logprob=True,
                             return_routed_experts=True, routed_experts_start_len=start)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = [torch.randint(6, SPEC.vocab_size, (int(torch.randint(10, 40, (1,), generator=g)),), generator=g).tolist()
           for _ in range(n)]
    if n > 1:  # a group's samples share the task prompt
        out[1] = out[0][:20] + out[1][20:] if len(out[1]) > 20 else out[0][:20] + out[1]
    return out


def trajectory(engine, ids, turns: int = 3):
    """A TITO-style loop: the next prompt is the previous stream plus an observation."""
    responses, start = [], 0
    for _ in range(turns):
        resp = engine.generate(request(ids, start))
        responses.append(resp)
        ids = list(ids) + list(resp.output_ids) + [7, 8, 9]
        start = len(ids) - 4
    return responses


def assert_same(new: P.GenerateResponse, old: P.GenerateResponse) -> None:
    assert new.output_ids == old.output_ids
    assert np.array_equal(new.routed_experts_RLK, old.routed_experts_RLK)
    assert max(abs(a - b) for a, b in zip(new.output_token_logprobs, old.output_token_logprobs)) < LOGPROB_TOL


def test_concurrent_multi_turn_trajectories_equal_the_recompute_path(engines):
    new, old = engines
    starts = prompts(6)
    results: list = [None] * len(starts)

    def run(i):
        results[i] = trajectory(new, starts[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(starts))]
    forwards, reused = new.scheduler.num_forwards, new.scheduler.pool.reused_tokens
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, ids in enumerate(starts):
        for got, want in zip(results[i], trajectory(old, ids)):
            assert_same(got, want)
    num_tokens = sum(len(r.output_ids) for rs in results for r in rs)
    assert new.scheduler.num_forwards - forwards < num_tokens  # requests decoded together
    assert new.scheduler.pool.reused_tokens > reused           # later turns reused earlier turns' K/V


def test_weight_update_between_turns_recomputes_the_cache(engines, tmp_path):
    new, old = engines
    ids = prompts(1, seed=3)[0]
    first = new.generate(request(ids))
    ckpt = write_checkpoint(tmp_path, seed=7, qkv_gain=6.0)
    for engine in (new, old):
        engine.update_weights(PC.UpdateWeightsFromDiskRequest(model_path=ckpt, weight_version="1"))
    follow = list(ids) + list(first.output_ids) + [7, 8]
    assert_same(new.generate(request(follow, len(follow) - 3)), old.generate(request(follow, len(follow) - 3)))


def test_abort_while_paused_and_a_request_joining_mid_decode(engines):
    new, _ = engines
    ids = prompts(1, seed=4)[0]
    new.pause("in_place")
    out: dict = {}
    waiting = threading.Thread(target=lambda: out.update(paused=new.generate(request(ids))))
    waiting.start()
    for _ in range(200):
        if new.num_running():
            break
        time.sleep(0.02)
    assert new.abort("", abort_all=True) == 1
    waiting.join(timeout=30)
    assert out["paused"].finish_reason.type == "abort" and out["paused"].output_ids == ()
    new.resume()
    long = threading.Thread(target=lambda: out.update(long=new.generate(request(ids, max_new=60))))
    long.start()
    time.sleep(0.05)
    joined = new.generate(request(prompts(2, seed=5)[1]))  # arrives while the long one decodes
    long.join(timeout=60)
    assert joined.finish_reason.type in ("stop", "length") and out["long"].finish_reason.type in ("stop", "length")


def test_an_endpoint_registered_from_another_module_is_served():
    import json
    import urllib.request
    from http.server import ThreadingHTTPServer

    from rl.engines import embedded_http
    from rl.engines.ports import free_port

    @embedded_http.route("POST", "/echo_version")
    def _echo(engine, read_body):
        return 200, {"weight_version": engine.weight_version, "body": read_body()}

    class Stub:
        weight_version = "v7"

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), embedded_http.make_handler(Stub()))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/echo_version", data=b'{"x": 1}', method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read()) == {"weight_version": "v7", "body": {"x": 1}}
    finally:
        server.shutdown()
        embedded_http.EXTRA_ROUTES.pop(("POST", "/echo_version"))


def test_model_info_reports_the_cache_peak_under_the_current_weights(tmp_path):
    """The K/V cache figure the run-health alarm health.kv-cache reads: the share of slots running
    requests held at their peak, since the weights loaded (retained prefixes are evictable: not counted)."""
    from rl.engines.embedded_http import _model_info

    ckpt = write_checkpoint(tmp_path / "a", seed=0)
    engine = EmbeddedEngine(SPEC, CompactVocab.identity(SPEC.vocab_size), torch.float32, 0, checkpoint=ckpt,
                            kv_slots=4)
    assert _model_info(engine)["kv_cache_peak"] == 0.0 and _model_info(engine)["kv_cache_slots"] == 4
    gate = threading.Barrier(4)

    def run(ids):
        gate.wait()
        engine.generate(request(ids, max_new=30))

    threads = [threading.Thread(target=run, args=(ids,)) for ids in prompts(4, seed=5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = _model_info(engine)
    assert info["kv_cache_peak"] >= 0.5 and info["kv_cache_usage"] == 0.0  # all finished: their slots retained
    engine.update_weights(PC.UpdateWeightsFromDiskRequest(model_path=write_checkpoint(tmp_path / "b", seed=1),
                                                          weight_version="1"))
    engine.generate(request(prompts(1, seed=6)[0]))
    assert _model_info(engine)["kv_cache_peak"] == 0.25  # a new window: one request, one slot of four
    engine.close()  # an in-process engine's scheduler thread ends (chaos scenarios close theirs)
    assert not engine.scheduler._thread.is_alive()
    with pytest.raises(EngineFailedError, match="engine closed"):
        engine.generate(request(prompts(1)[0]))
