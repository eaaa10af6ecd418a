"""Weight-sync time of both modes, as a ratio to a memcpy of the same bytes in the same run.

    python bench/bench_sync.py [--states tiny,1gib] [--repeat 3]
    python bench/bench_sync.py --delta [--states 1gib] [--steps 3]

For each state, a trainer in this process (rank 0) and one embedded engine process (fp32, so
the bytes moved equal the state's bytes) reached by URL; each mode is timed end to end through
SGLang's endpoints, as the weight-sync barrier calls it (``t1ops.guards.weight_sync``):

- ``disk``: Hugging Face export (safetensors) + ``/update_weights_from_disk`` + version check;
- ``distributed``: ``/update_weights_from_distributed`` per bucket while rank 0 broadcasts over
  gloo, + version check (the group is formed once, beforehand; its formation is printed apart);
- ``memcpy``: ``dst.copy_(src)`` of the same tensors in this process (the floor).

States: ``tiny`` = the tiny campaign's model with its full 248,320-id vocabulary (hidden 64);
``1gib`` = one layer with hidden 544 and the full vocabulary (embedding + LM head ~ 1 GiB fp32).
Best of ``--repeat`` runs each. On a CPU host "distributed" is gloo over loopback TCP; with
NCCL between GPUs the same protocol moves bytes at link speed.

``--delta``: delta sync (``rl.weights.delta``) beside today's full distributed sync in the same
run, as a campaign serves it (one bf16 engine, bf16 on the wire): the full push of the initial
weights, then per step a PPO-clip step (AdamW at the report's learning rate, 1e-6, on a random
batch) and its delta push. Printed per push: bytes sent as a fraction of the model's bf16 bytes,
and the push's time (the delta's encoding included) as a ratio to a memcpy of the full bf16 state;
then a full push of the last version for the same ratio.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx
import torch

from rl.engines.client import EngineClient
from rl.engines.embedded_spawn import spawn
from rl.engines.ports import free_port
from rl.megatron_cpu import init_single_process
from rl.model import ModelSpec, build_policy, weights_state_dict
from rl.weights.sender import WeightSender
from t1ops.guards.weight_sync import DiskSync, DistributedSync, LocalTrainerSender

STATES = {
    "tiny": ModelSpec(max_seq_len=256),
    "1gib": ModelSpec(num_layers=1, hidden_size=544, num_attention_heads=8, num_query_groups=2, ffn_hidden_size=512,
                      num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=256, max_seq_len=256),
}


class _Trainer(WeightSender):
    def __init__(self, spec: ModelSpec, export_dir: Path) -> None:
        self.spec, self.state = spec, weights_state_dict(build_policy(spec, seed=1))
        self.configure_weight_sender(dtype="float32", export_dir=str(export_dir), keep_exports=1)

    def _published_weights(self, version):
        return self.state, self.spec


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_state(name: str, spec: ModelSpec, repeat: int, tmp: Path) -> None:
    trainer = _Trainer(spec, tmp / name)
    num_bytes = sum(t.numel() * t.element_size() for t in trainer.state.values())
    src = list(trainer.state.values())
    dst = [torch.empty_like(t) for t in src]
    memcpy_s = _best(lambda: [d.copy_(s) for d, s in zip(dst, src)], repeat)
    engine = spawn(free_port(), spec, dtype="fp32", seed=2, log_path=tmp / f"{name}-engine.log")
    http = httpx.Client(timeout=None)
    try:
        targets = [(0, EngineClient(engine.url, http))]
        versions = iter(range(1, 1000))
        disk = DiskSync(trainer.weight_export)
        disk_s = _best(lambda: _ok(disk.publish(targets, "", str(next(versions)))), repeat)
        dist = DistributedSync(LocalTrainerSender(trainer), "gloo")
        t0 = time.perf_counter()
        _ok(dist.publish(targets, "", str(next(versions))))  # forms the group, then the first transfer
        first_s = time.perf_counter() - t0
        dist_s = _best(lambda: _ok(dist.publish(targets, "", str(next(versions)))), repeat)
    finally:
        engine.kill()
        engine.wait()
        http.close()
    gib = num_bytes / (1 << 30)
    print(f"{name:5s} {gib:6.3f} GiB  memcpy {memcpy_s * 1e3:9.1f} ms  disk {disk_s:7.2f} s "
          f"({disk_s / memcpy_s:6.1f}x memcpy)  distributed {dist_s:7.2f} s ({dist_s / memcpy_s:6.1f}x memcpy, "
          f"disk/distributed {disk_s / dist_s:4.1f}x)  first distributed incl. group {first_s:6.2f} s", flush=True)


class _Stepping(WeightSender):
    """A policy trained by PPO-clip + AdamW (lr 1e-6), keeping the versions it published."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec, self.policy = spec, build_policy(spec, seed=1)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=1e-6, weight_decay=0.01)
        self.versions: dict[str, dict[str, torch.Tensor]] = {}
        self.configure_weight_sender(dtype="bfloat16", bucket_bytes=512 << 20)

    def publish(self, version: str) -> None:
        self.versions = {v: s for v, s in self.versions.items() if int(v) >= int(version) - 1}  # two kept
        self.versions[version] = {k: v.detach().clone() for k, v in weights_state_dict(self.policy).items()}

    def ppo_step(self, seed: int) -> None:
        from rl.losses import ppo_clip_loss
        from rl.model import token_logprobs

        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, self.spec.vocab_size, (4, 33), generator=gen)
        lp = token_logprobs(self.policy, ids[:, :-1], ids[:, 1:])
        adv = torch.randn(lp.shape, generator=gen)
        loss, _ = ppo_clip_loss(lp, lp.detach(), adv, torch.ones_like(lp, dtype=torch.bool))
        self.optimizer.zero_grad()
        loss.mean().backward()
        self.optimizer.step()

    def _published_weights(self, version):
        return self.versions[version], self.spec


def bench_delta(name: str, spec: ModelSpec, steps: int, tmp: Path) -> None:
    trainer = _Stepping(spec)
    trainer.publish("1")
    src = [t.to(torch.bfloat16) for t in trainer.versions["1"].values()]
    model_bytes = sum(t.numel() * t.element_size() for t in src)
    dst = [torch.empty_like(t) for t in src]
    memcpy_s = _best(lambda: [d.copy_(s) for d, s in zip(dst, src)], 3)
    del src, dst
    engine = spawn(free_port(), spec, dtype="bf16", seed=2, log_path=tmp / f"{name}-delta-engine.log")
    http = httpx.Client(timeout=None)
    rows = []
    try:
        targets = [(0, EngineClient(engine.url, http))]
        sync = DistributedSync(LocalTrainerSender(trainer), "gloo", delta=True)

        def push(version: str) -> None:
            t0 = time.perf_counter()  # the buckets (a delta's encoding) first, timed apart; publish reuses them
            trainer.weight_buckets(version, sync.base if sync.base is not None else None)
            encode_s = time.perf_counter() - t0
            _ok(sync.publish(targets, "", version))
            seconds = time.perf_counter() - t0
            expected = trainer.weight_checksums(version)["tensors"]
            loaded = targets[0][1].weight_checksums("bfloat16")["tensors"]
            if loaded != expected:
                raise RuntimeError(f"version {version}: the engine's checksums differ from the trainer's")
            rows.append((version, sync.last["base"], sync.last["bytes"], seconds, encode_s))

        push("1")  # full: a new group
        for step in range(2, steps + 2):
            trainer.ppo_step(seed=step)
            trainer.publish(str(step))
            push(str(step))
        sync.base = None  # today's full sync of the same last version, in the same run
        trainer.publish(str(steps + 2))
        trainer.versions[str(steps + 2)] = trainer.versions[str(steps + 1)]
        push(str(steps + 2))
    finally:
        engine.kill()
        engine.wait()
        http.close()
    print(f"{name}: model {model_bytes / (1 << 30):.3f} GiB bf16, memcpy of it {memcpy_s * 1e3:.1f} ms "
          "(every push below: engine checksums == trainer's)", flush=True)
    for version, base, sent, seconds, encode_s in rows:
        kind = f"delta from v{base}" if base is not None else "full"
        print(f"  v{version:<3s} {kind:14s} sent {sent / (1 << 20):9.2f} MiB = {sent / model_bytes:7.4f} of the model  "
              f"{seconds:6.2f} s = {seconds / memcpy_s:6.1f}x memcpy (buckets/encoding {encode_s:5.2f} s)", flush=True)


def _ok(failures: dict) -> None:
    if failures:
        raise RuntimeError(f"sync failed: {failures}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--states", default="tiny,1gib", help=f"comma-separated, of {sorted(STATES)}")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--delta", action="store_true", help="delta sync after PPO steps beside a full sync")
    ap.add_argument("--steps", type=int, default=3, help="--delta: PPO steps (one delta push each)")
    args = ap.parse_args()
    init_single_process()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        for name in args.states.split(","):
            if args.delta:
                bench_delta(name, STATES[name], args.steps, Path(tmp))
            else:
                bench_state(name, STATES[name], args.repeat, Path(tmp))


if __name__ == "__main__":
    main()
