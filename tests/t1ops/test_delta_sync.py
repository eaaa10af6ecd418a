"""Delta weight sync against embedded engine processes (bf16, as served): after an Adam step at the
report's learning rate only what changed moves, the engines then hold exactly the trainer's state
(the barrier's per-tensor checksums), a delta against the wrong base is refused by name, and a
changed group, a re-push or an engine at another version gets the full weights (docs/weights.md,
"Delta sync")."""
from __future__ import annotations

import concurrent.futures as cf
import time

import pytest
import torch

from rl.engines import protocol_weights as PW
from rl.errors import T1OpsError
from rl.megatron_cpu import init_single_process
from rl.model import ModelSpec, build_policy, token_logprobs, weights_state_dict
from rl.weights.checksums import mismatched
from rl.weights.sender import WeightSender
from t1ops import telemetry
from t1ops.guards.weight_sync import DistributedSync, LocalTrainerSender
from tests.t1ops.engine_pair import engine_pair

SPEC = ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=32,
                 num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=64, vocab_size=256)


class _Trainer(WeightSender):
    """A policy, AdamW at 1e-6, and the versions it published (a delta needs its base)."""

    def __init__(self) -> None:
        init_single_process()
        self.policy = build_policy(SPEC, seed=11)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=1e-6)
        self.versions: dict[str, dict[str, torch.Tensor]] = {}
        self.configure_weight_sender(dtype="bfloat16", bucket_bytes=20_000, timeout_s=60)

    def publish(self, version: str) -> None:
        self.versions[version] = {k: v.detach().clone() for k, v in weights_state_dict(self.policy).items()}

    def step(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, SPEC.vocab_size, (2, 17), generator=gen)
        self.optimizer.zero_grad()
        (-token_logprobs(self.policy, ids[:, :-1], ids[:, 1:]).mean()).backward()
        self.optimizer.step()

    def _published_weights(self, version):
        return self.versions[version], SPEC


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    yield from engine_pair(SPEC, "bf16", tmp_path_factory.mktemp("engines"))


def _loaded_as_sent(trainer, engines, version) -> None:
    expected = trainer.weight_checksums(version)
    for _, client in engines:
        assert mismatched(expected["tensors"], client.weight_checksums("bfloat16")["tensors"]) == []
        assert client.weight_version() == version


def _wrong_base(trainer, client, group_name) -> str:
    """Every bucket of the delta 2 -> 3 announced against base '1'; the refusals' messages."""
    out = []
    for bucket in trainer.weight_buckets("3", "2"):
        try:
            client.update_weights_from_distributed(PW.UpdateWeightsFromDistributedRequest(
                names=bucket.names, dtypes=bucket.dtypes, shapes=bucket.shapes, group_name=group_name,
                delta_base="1", delta_kinds=bucket.kinds))
        except T1OpsError as exc:
            out.append(str(exc))
    return " | ".join(out)


def test_delta_sync_moves_only_what_changed_and_every_case_that_cannot_gets_it_whole(engines):
    trainer = _Trainer()
    sync = DistributedSync(LocalTrainerSender(trainer), "gloo", delta=True)
    trainer.publish("1")
    assert sync.publish(engines, "", "1") == {} and sync.last["base"] is None  # a new group: full
    full_bytes = sync.last["bytes"]
    _loaded_as_sent(trainer, engines, "1")

    trainer.step(seed=1)
    trainer.publish("2")
    assert sync.publish(engines, "", "2") == {} and sync.last["base"] == "1"
    assert 0 < sync.last["bytes"] < full_bytes / 4, (sync.last, full_bytes)  # lr 1e-6: few bf16 values move
    _loaded_as_sent(trainer, engines, "2")  # the barrier's proof: equal to the full state

    # a delta against a base the engines do not hold is received (the broadcast completes), then
    # refused by name, and nothing of it is loaded
    trainer.step(seed=2)
    trainer.publish("3")
    handle = LocalTrainerSender(trainer).send("3", "2")
    with cf.ThreadPoolExecutor(2) as pool:
        errors = list(pool.map(lambda c: _wrong_base(trainer, c, sync.group_name), [c for _, c in engines]))
    handle.result(timeout=60)
    assert all("a delta against base version '1' was refused: this engine holds version '2'" in e for e in errors)
    _loaded_as_sent(trainer, engines, "2")

    # an engine at another version than the group's base: the next push is full
    engines[1][1].update_weight_version("elsewhere", abort_all_requests=False)
    assert sync.publish(engines, "", "3") == {} and sync.last["base"] is None
    _loaded_as_sent(trainer, engines, "3")
    assert sync.publish(engines, "", "3") == {} and sync.last["base"] is None  # a re-push (a mismatch): full
    trainer.step(seed=3)
    trainer.publish("4")
    assert sync.publish(engines[:1], "", "4") == {} and sync.last["base"] is None  # the group changed: full
    _loaded_as_sent(trainer, engines[:1], "4")
    trainer.step(seed=4)
    trainer.publish("5")
    assert sync.publish(engines[:1], "", "5") == {} and sync.last["base"] == "4"
    _loaded_as_sent(trainer, engines[:1], "5")

    # an engine whose version changes between the trainer's question and the delta (a race) refuses
    # it by name; the same push then sends the whole weights
    class _Racing(LocalTrainerSender):
        def buckets(self, version, base=None):
            if base is not None:
                engines[1][1].update_weight_version("raced", abort_all_requests=False)
            return super().buckets(version, base)

    trainer.publish("6")
    assert sync.publish(engines, "", "6") == {} and sync.last["base"] is None  # the group changed: full
    trainer.step(seed=6)
    trainer.publish("7")
    sync.sender = _Racing(trainer)
    since = time.time()
    assert sync.publish(engines, "", "7") == {} and sync.last["base"] is None
    refused = telemetry.recent_events("engine.weight_delta_refused", since=since)
    assert refused and refused[0]["slots"] == "[1]" and "holds version 'raced'" in refused[0]["reason"]
    _loaded_as_sent(trainer, engines, "7")
    trainer.weight_close_group()
