"""Both weight-sync modes against embedded engine processes, through SGLang's endpoints.

The trainer side runs in this process (rank 0 of a gloo group beside megatron's world of 1);
the engines are real processes reached by URL. After a sync the engine (fp32) must give the
trainer's log-probs for a greedy continuation: the weights arrived, converted and loaded.
"""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from rl.engines import protocol as P
from rl.engines.client import EngineClient
from rl.megatron_cpu import init_single_process
from rl.model import ModelSpec, build_policy, token_logprobs, weights_state_dict
from rl.weights.sender import WeightSender
from t1ops.guards.weight_sync import DiskSync, DistributedSync, LocalTrainerSender
from tests.t1ops.engine_pair import engine_pair

SPEC = ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=32,
                 num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=64, vocab_size=256)


class _Trainer(WeightSender):
    def __init__(self, tmp_path) -> None:
        init_single_process()
        self.policy = build_policy(SPEC, seed=11).eval()
        self.configure_weight_sender(dtype="float32", bucket_bytes=20_000, timeout_s=60,
                                     export_dir=str(tmp_path / "exports"))

    def _published_weights(self, version):
        return weights_state_dict(self.policy), SPEC


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Two engine processes for the whole module (each test publishes its own versions, 1-5; the
    distributed test, first in the file, reads the engines' initial weights)."""
    yield from engine_pair(SPEC, "fp32", tmp_path_factory.mktemp("engines"))


def _engine_logprobs(client: EngineClient) -> tuple[list[int], np.ndarray]:
    prompt = [5, 17, 3, 200, 42]
    resp = client.generate(P.GenerateRequest(input_ids=tuple(prompt), sampling_params=P.SamplingParams(
        max_new_tokens=6, temperature=0.0)))
    return prompt + list(resp.output_ids), np.asarray(resp.output_token_logprobs)


def _trainer_logprobs(trainer: _Trainer, ids: list[int], num_out: int) -> np.ndarray:
    ids_1T = torch.tensor([ids[:-1]])
    with torch.no_grad():
        lps = token_logprobs(trainer.policy, ids_1T, torch.tensor([ids[1:]]))[0]
    return lps[-num_out:].numpy()


def _assert_serves_trainer_weights(trainer, client, version):
    assert client.weight_version() == version
    ids, engine_lps = _engine_logprobs(client)
    np.testing.assert_allclose(engine_lps, _trainer_logprobs(trainer, ids, len(engine_lps)), atol=1e-4)


def test_distributed_sync_broadcasts_into_every_engine(tmp_path, engines):
    trainer = _Trainer(tmp_path)
    ids, before = _engine_logprobs(engines[0][1])
    assert not np.allclose(before, _trainer_logprobs(trainer, ids, len(before)), atol=1e-4)  # other init
    sync = DistributedSync(LocalTrainerSender(trainer), "gloo")
    assert sync.publish(engines, "unused", "1") == {}
    assert len(trainer.weight_buckets("1")) > 2  # several requests: bucketing exercised
    for _, client in engines:
        _assert_serves_trainer_weights(trainer, client, "1")
    with torch.no_grad():  # a second sync over the same group carries new weights
        for p in trainer.policy.parameters():
            p.mul_(1.01)
    group = sync.group_name
    assert sync.publish(engines, "unused", "2") == {} and sync.group_name == group
    for _, client in engines:
        _assert_serves_trainer_weights(trainer, client, "2")
    assert sync.publish(engines[:1], "unused", "3") == {} and sync.group_name != group  # membership changed


def test_disk_sync_loads_the_hugging_face_export(tmp_path, engines):
    trainer = _Trainer(tmp_path)
    sync = DiskSync(trainer.weight_export)
    assert sync.publish(engines, "unused", "4") == {}
    assert (tmp_path / "exports" / "v00000004" / "config.json").is_file()
    for _, client in engines:
        _assert_serves_trainer_weights(trainer, client, "4")


def test_a_failed_engine_is_reported_by_slot(tmp_path, engines):
    trainer = _Trainer(tmp_path)
    dead = EngineClient("http://127.0.0.1:9", httpx.Client(timeout=5))  # nothing listens on port 9
    failures = DiskSync(trainer.weight_export).publish([engines[0], (7, dead)], "unused", "5")
    assert list(failures) == [7] and "ConnectError" in failures[7]


def test_a_backend_the_trainer_lacks_fails_before_any_engine_is_asked(tmp_path):
    if torch.distributed.is_backend_available("nccl"):
        pytest.skip("this torch has NCCL")

    class _Unreachable:
        base_url = "http://never"

        def init_weights_update_group(self, request):
            raise AssertionError("an engine was asked to join a group rank 0 cannot host")

    failures = DistributedSync(LocalTrainerSender(_Trainer(tmp_path)), "nccl").publish([(0, _Unreachable())], "", "1")
    assert "no 'nccl' backend" in failures[0] and "weight_sync_backend" in failures[0]
