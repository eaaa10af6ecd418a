"""weight-sync-corruption: a multi-chunk weight update silently corrupts what the engine serves.

SkyRL issue #1680 (github.com/NovaSky-AI/SkyRL/issues/1680, fixed in SkyRL PR #1737): after the
first weight sync a MoE model's rollouts drifted to wrong answers, then gibberish; every call of
the chunked update succeeded, no error anywhere.

Fault: a real embedded engine (``--chaos --chaos-corrupt-weight-bucket N``) receives the
trainer's distributed update (``/init_weights_update_group`` + one
``/update_weights_from_distributed`` per bucket, gloo broadcasts from the trainer in this
process, :mod:`rl.weights`); on its way from the receive to the load, the N-th bucket has two
same-shaped tensors swapped (an expert's ``gate_proj`` and ``up_proj``: a reordered chunk). The
engine answers success and reports the new version.

- Unguarded: the pool's barrier with ``engine.verify_weights = false``: the sync succeeds,
  the engine serves version 1, and its greedy log-probs differ from the trainer's model.
- Guarded (the same engine, the same group): ``verify_weights = true``. After the publish the
  engine's checksums of the tensors in its model differ from the trainer's of what it sent;
  the engine stays out of traffic, is re-synced, matches, and then serves the trainer's
  log-probs exactly.
- Guarded, a delta (``rl.weights.delta``): pushes after the first carry only what changed since
  the engine's version; a third version changes 1% of the elements, so its push is a sparse delta,
  and its first chunk is reordered in transit too. The checksums name it, the re-push is the full
  weights (never a delta on a base that failed), and the engine then serves version 3 exactly.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.scenarios.dead_engine import engine_client, kill_all
from rl.engines import protocol as P
from rl.engines.ports import free_port
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.slots import EngineHandle
from t1ops.engines.pool import EnginePool
from t1ops.guards.http import BoundedHttp
from t1ops.guards.weight_sync import DistributedSync, LocalTrainerSender

BUCKET_BYTES = 40_000    # several buckets per update: the multi-chunk path of the field report
PROMPT = (5, 17, 3, 200, 42)
NEW_TOKENS = 6


def _spec():
    from rl.model import ModelSpec
    return ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=32,
                     num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=64, vocab_size=256)


def _trainer(tmp: Path):
    from rl.megatron_cpu import init_single_process
    from rl.model import build_policy, weights_state_dict
    from rl.weights.sender import WeightSender

    class Trainer(WeightSender):
        """Versions "1" (the seed), "2" (every weight moved) and "3" (1% of the elements moved), made
        up front so the buckets each push carries are known before the engine starts."""

        def __init__(self) -> None:
            init_single_process()
            self.policy = build_policy(_spec(), seed=11).eval()
            self.configure_weight_sender(dtype="float32", bucket_bytes=BUCKET_BYTES, timeout_s=60,
                                         export_dir=str(tmp / "exports"))
            gen = torch.Generator().manual_seed(7)
            v1 = {k: v.detach().clone() for k, v in weights_state_dict(self.policy).items()}
            v2 = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in v1.items()}
            v3 = {k: torch.where(torch.rand(v.shape, generator=gen) < 0.01, v + 0.05, v) for k, v in v2.items()}
            self.versions = {"1": v1, "2": v2, "3": v3}

        def _published_weights(self, version):
            return self.versions[version], _spec()

        def serve(self, version: str) -> None:  # "training": the policy is now that version
            from rl.model import load_state
            load_state(self.policy, self.versions[version], source=f"version {version}")
    return Trainer()


def _max_logprob_gap(trainer, client) -> float:
    """Greedy continuation on the engine; |engine log-prob - trainer log-prob| at its tokens (max)."""
    from rl.model import token_logprobs
    resp = client.generate(P.GenerateRequest(input_ids=PROMPT, sampling_params=P.SamplingParams(
        max_new_tokens=NEW_TOKENS, temperature=0.0), return_logprob=True))
    ids = list(PROMPT) + list(resp.output_ids)
    with torch.no_grad():
        ref = token_logprobs(trainer.policy, torch.tensor([ids[:-1]]), torch.tensor([ids[1:]]))[0][-NEW_TOKENS:]
    return float(np.max(np.abs(np.asarray(resp.output_token_logprobs) - ref.numpy())))


def _pool(proc, sync, version: str, verify: bool, owned: bool) -> EnginePool:
    cfg = EngineConfig(num_engines=1, health_interval_s=0.3, failure_threshold=2, warmup_grace_s=30.0,
                       request_timeout_s=5.0, request_attempts=2, retry_backoff_s=0.05, generate_timeout_s=60.0,
                       verify_weights=verify, weight_resyncs=1, resume_deadline_s=10.0)
    client = engine_client(proc.url, BoundedHttp.from_config(cfg))
    pool = EnginePool(lambda slot: EngineHandle(url=proc.url, client=client, process=proc if owned else None), cfg,
                      version=version, weight_sync=sync)
    pool.start()
    pool.wait_until_live(timeout_s=60)
    return pool


@register("weight-sync-corruption", "a multi-chunk weight update silently corrupts the engine's weights")
def run(tmp: Path) -> Outcome:
    import torch.distributed as dist

    from rl.engines.embedded_spawn import spawn

    had_world = dist.is_initialized()
    trainer = _trainer(tmp)
    num_buckets = len(trainer.weight_buckets("1"))
    num_delta2, num_delta3 = len(trainer.weight_buckets("2", "1")), len(trainer.weight_buckets("3", "2"))
    # the second bucket of the full push of 1 and of the delta 1 -> 2 (its every weight moved), then
    # (after the full re-push of 2) the first bucket of the sparse delta 2 -> 3
    corrupt = [2, num_buckets + 2, num_buckets + num_delta2 + num_buckets + 1]
    proc = spawn(free_port(), _spec(), dtype="fp32", seed=99, log_path=tmp / "engine.log",
                 extra_args=["--chaos", *[a for n in corrupt for a in ("--chaos-corrupt-weight-bucket", str(n))]])
    sync = DistributedSync(LocalTrainerSender(trainer), "gloo", delta=True)
    try:
        bad_pool = _pool(proc, sync, "default", verify=False, owned=False)
        try:
            bad_report = bad_pool.sync_weights("unused", "1")
            bad_live = bad_pool.live_slots()
            bad_gap = _max_logprob_gap(trainer, bad_pool.slot(0).client)
            bad_version = bad_pool.slot(0).client.weight_version()
        finally:
            bad_pool.close()
        trainer.serve("2")
        good_pool = _pool(proc, sync, "1", verify=True, owned=True)
        try:
            since = time.time()
            t0 = time.monotonic()
            good_report = good_pool.sync_weights("unused", "2")
            mismatch = telemetry.recent_events("engine.weights_mismatch", since=since)
            resynced = telemetry.recent_events("engine.weights_resynced", since=since)
            good_gap = _max_logprob_gap(trainer, good_pool.slot(0).client)
            good_live = good_pool.live_slots()
            sync_s = time.monotonic() - t0
            trainer.serve("3")
            since3 = time.time()
            delta_report = good_pool.sync_weights("unused", "3")
            delta_pushes = [(e.get("base"), e.get("bytes")) for e in
                            telemetry.recent_events("engine.weight_push", since=since3)]
            delta_mismatch = telemetry.recent_events("engine.weights_mismatch", since=since3)
            delta_gap = _max_logprob_gap(trainer, good_pool.slot(0).client)
        finally:
            good_pool.close()
    finally:
        trainer.weight_close_group()  # the group's name is free again for the next run in this process (soak)
        kill_all([proc])
        if not had_world and dist.is_initialized():  # leave no world of 1 behind: a scenario that forks
            dist.destroy_process_group()             # ranks next (group-init-race) would hand it to them
    log = (tmp / "engine.log").read_text(errors="replace")
    swaps = [line for line in log.splitlines() if line.startswith("chaos: bucket")]
    detect_s = mismatch[0].get("detect_s") if mismatch else None
    full_bytes = sum(b.num_bytes for b in trainer.weight_buckets("3"))
    delta_caught = (len(delta_pushes) == 2 and delta_pushes[0][0] == "2" and delta_pushes[1][0] == "None"
                    and 0 < delta_pushes[0][1] < full_bytes / 4 and bool(delta_mismatch)
                    and delta_report.live_slots == (0,) and delta_gap < 1e-4)
    tl = Timeline()  # wall clock, from the guarded sync's start (its second bucket arrives reordered)
    tl.fault(at=since)
    tl.after_fault(detected=mismatch[0]["time"] - since if mismatch else None,
                   healthy=resynced[0]["time"] - since if resynced and good_gap < 1e-4 else None)
    return Outcome(
        fault_fired=len(swaps) == 3 and num_buckets > 2,
        unguarded=(f"weights_checksum off: the {num_buckets}-bucket update to version 1 succeeded "
                   f"(live {bad_live}, engine reports {bad_version!r}) while a chunk was reordered "
                   f"({swaps[0] if swaps else 'no swap'}); the engine's greedy log-probs differ from the "
                   f"trainer's by up to {bad_gap:.3g}"),
        guarded=Guarded(caught=bool(mismatch) and good_live == [0] and good_gap < 1e-4 and delta_caught,
                        detection_s=detect_s,
                        error=(f"engine.weights_mismatch: {mismatch[0].get('num_tensors')} tensor(s) differ "
                               f"({mismatch[0].get('tensors')}); re-synced, then matched" if mismatch else "")),
        invariants={
            "unguarded_serves_corrupted_weights_silently": bad_gap > 1e-3 and bad_live == [0] and bad_version == "1"
            and bad_report.dead_slots == (),
            "mismatch_named_the_swapped_tensors": bool(mismatch) and mismatch[0].get("num_tensors", 0) >= 2,
            "engine_resynced_before_serving": len(resynced) == 1 and good_report.live_slots == (0,),
            "guarded_engine_serves_trainer_weights": good_gap < 1e-4,
            "delta_chunk_reordered_caught_then_full_resend": delta_caught,
        },
        details={"num_buckets": num_buckets, "swaps": swaps, "unguarded_gap": bad_gap, "guarded_gap": good_gap,
                 "guarded_sync_s": round(sync_s, 3), "mismatch": mismatch[:1], "resynced": resynced[:1],
                 "delta_pushes_base_bytes": delta_pushes, "full_bytes": full_bytes, "delta_gap": delta_gap,
                 "delta_mismatch": delta_mismatch[:1]},
        recovery=tl.recovery(how="re-sync in the same barrier: the engine serves only verified weights"))
