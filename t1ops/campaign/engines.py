"""The engine router: the engine pool as one Ray actor.

The pool (:class:`~t1ops.engines.pool.EnginePool`: health pings, warm-up
grace, recreation, the weight-sync barrier) lives here, in its own actor, not
in the coordinator. Rollout workers do not send their requests through it:
they read its ``view`` (engine addresses, health, version, gate) and call the
engines directly (:class:`t1ops.engines.direct.DirectEngines`), reporting
failed calls back with ``report_failure``; ``generate`` remains for callers
without a worker.
The engine processes are this actor's children (the embedded CPU engine by
default; ``engine.kind = "sglang"`` points the pool at running servers).
"""
from __future__ import annotations

import subprocess
from functools import partial
from pathlib import Path

from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.slots import spawn_factory, url_factory
from t1ops.engines.pool import EnginePool
from t1ops.guards.http import BoundedHttp
from t1ops.guards.weight_sync import CheckpointDirSync, DiskSync, DistributedSync


#: The version engines serve when started from the model's own initial weights (SGLang's default name):
#: the campaign starts them so, concurrently with the trainer's warm start, and syncs version 0 after it.
INITIAL_VERSION = "default"


class RayTrainerSender:
    """:class:`~t1ops.guards.weight_sync.TrainerSender` over the trainer's Ray actor (rl.weights.sender)."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def group_address(self, backend: str):
        import ray

        return tuple(ray.get(self.actor.weight_group_address.remote(backend)))

    def open_group(self, *, master_port: int, world_size: int, group_name: str, backend: str):
        return self.actor.weight_open_group.remote(master_port, world_size, group_name, backend)

    def buckets(self, version: str):
        import ray

        return ray.get(self.actor.weight_buckets.remote(version))

    def send(self, version: str):
        return self.actor.weight_send.remote(version)

    def checksums(self, version: str) -> dict:
        import ray

        return ray.get(self.actor.weight_checksums.remote(version))

    def close_group(self) -> None:
        import ray

        ray.get(self.actor.weight_close_group.remote())

    def wait(self, handle):
        import ray

        return ray.get(handle)


def build_weight_sync(cfg: EngineConfig, trainer, version: str, checkpoint_dir: str | None = None):
    """The pool's weight sync for ``engine.weight_sync`` (docs/weights.md); no trainer: the checkpoint dir.
    Engines that start from a checkpoint get its export for admission; ones that start from initial
    weights (``checkpoint_dir`` None) get the trainer's weights at the first barrier."""
    import ray

    if trainer is None:
        return CheckpointDirSync()
    if cfg.weight_sync == "disk":
        sync = DiskSync(lambda v: ray.get(trainer.weight_export.remote(v)),
                        checksums=lambda v: ray.get(trainer.weight_checksums.remote(v)))
        if checkpoint_dir is not None:
            sync.last_export = sync.export(version)  # what an engine at another version loads on admission
        return sync
    backend = cfg.weight_sync_backend or ("gloo" if cfg.kind == "embedded" else "nccl")
    return DistributedSync(RayTrainerSender(trainer), backend)


class EngineRouter:
    def __init__(self, *, engine_cfg: dict, spec: dict, vocab_path: str, checkpoint_dir: str | None, version: str,
                 num_moe_layers: int, topk: int, num_experts: int, log_path: str | None = None,
                 run_dir: str | None = None, telemetry_cfg: dict | None = None, pause_mode: str = "abort",
                 trainer=None) -> None:
        if run_dir is not None:
            telemetry.setup(run_dir, role="router", **(telemetry_cfg or {}))
        self.cfg = EngineConfig(**engine_cfg)
        self.http = BoundedHttp.from_config(self.cfg)
        client_kw = dict(num_moe_layers=num_moe_layers, topk=topk, num_experts=num_experts)
        self.client_kw = client_kw
        if self.cfg.kind == "embedded":
            from rl.engines.embedded import spawn
            from rl.model import ModelSpec

            launch = partial(spawn, spec=ModelSpec(**spec), vocab_path=vocab_path,
                             dtype=self.cfg.dtype, log_path=log_path, batching=self.cfg.batching,
                             batch_invariant=self.cfg.batch_invariant,
                             emission_dir=None if run_dir is None else str(Path(run_dir) / "emissions"))
            # a recreated engine starts from the newest published weights: the first checkpoint
            # may be gone by then (checkpoint retention), and the engine would exit at startup
            factory = spawn_factory(lambda port: launch(port, checkpoint=self._spawn_checkpoint(checkpoint_dir)),
                                    self.http, **client_kw)
        else:  # external SGLang servers: the pool re-admits a URL once its operator restarts it
            factory = url_factory(self.cfg.urls, self.http, **client_kw)
        self.pool = EnginePool(factory, self.cfg, version=version, checkpoint_dir=checkpoint_dir,
                               pause_mode=pause_mode,  # in_place: fully async, requests span syncs
                               weight_sync=build_weight_sync(self.cfg, trainer, version, checkpoint_dir))
        self.pool.start()

    def wait_until_live(self) -> str:
        if isinstance(self.pool.weight_sync, DistributedSync):  # engines at another version join now
            self.pool.wait_until_ready()
            self.pool.publish_to_waiting()
        self.pool.wait_until_live()
        return self.pool.describe()

    def generate(self, request):
        return self.pool.generate(request)

    def view(self) -> dict:
        """Engine addresses, health, version and gate for workers that call engines directly."""
        return self.pool.view()

    def report_failure(self, index: int, url: str, reason: str, wrong_version: bool = False,
                       engine_failed: bool = False) -> None:
        self.pool.report_failure(index, url, reason, wrong_version=wrong_version, engine_failed=engine_failed)

    def client_config(self) -> dict:
        """The engine config and routing shape a worker's direct clients need."""
        return {"engine_cfg": self.cfg.model_dump(), "client_kw": dict(self.client_kw)}

    def _spawn_checkpoint(self, first: str | None) -> str | None:
        pool = getattr(self, "pool", None)  # None while the pool starts its first engines
        latest = getattr(pool, "checkpoint_dir", None)
        return latest if latest and Path(latest).exists() else first

    def sync_weights(self, checkpoint_dir: str, version: str) -> dict:
        report = self.pool.sync_weights(checkpoint_dir, version)
        return {"duration_s": report.duration_s, "live": list(report.live_slots), "dead": list(report.dead_slots),
                "recreated": list(report.recreated_slots), "aborted": report.num_aborted_in_flight}

    def describe(self) -> str:
        return self.pool.describe()

    def dead_engines(self) -> list[str]:
        out = []
        for i in range(self.cfg.num_engines):
            status, reason, _ = self.pool.slot_state(i)
            if status == "dead":
                out.append(f"engine {i} ({reason})")
        return out

    def engine_pids(self) -> list[int]:
        """Pids of the engine processes this router owns (for chaos and host guards)."""
        handles = [self.pool.slot(i) for i in range(self.cfg.num_engines)]
        return [h.process.pid for h in handles if h is not None and isinstance(h.process, subprocess.Popen)]

    def close(self) -> None:
        self.pool.close()
        telemetry.shutdown()
