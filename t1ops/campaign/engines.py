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

from rl.engines.embedded_spawn import spawn  # torch-free: the router only starts engines (docs/testing.md)
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.engines.slots import spawn_factory, url_factory
from t1ops.engines.pool import EnginePool
from t1ops.guards.http import BoundedHttp
from t1ops.guards.weight_sync import CheckpointDirSync, JoinsAtBarrier, Pushed


#: The version engines serve when started from the model's own initial weights (SGLang's default name):
#: the campaign starts them so, concurrently with the trainer's warm start, and syncs version 0 after it.
INITIAL_VERSION = "default"


def router_weight_sync(cfg: EngineConfig):
    """What the router's pool does itself for ``engine.weight_sync`` (docs/weights.md): never a push
    (the trainer pushes inside the coordinator's barrier, t1ops.campaign.barrier); only admission.
    Disk: an engine at another version loads the last pushed export alone. Distributed: it waits
    for the next barrier."""
    return CheckpointDirSync() if cfg.weight_sync == "disk" else JoinsAtBarrier()


class EngineRouter:
    def __init__(self, *, engine_cfg: dict, spec: dict, vocab_path: str, checkpoint_dir: str | None, version: str,
                 num_moe_layers: int, topk: int, num_experts: int, log_path: str | None = None,
                 run_dir: str | None = None, telemetry_cfg: dict | None = None, pause_mode: str = "abort") -> None:
        if run_dir is not None:
            telemetry.setup(run_dir, role="router", **(telemetry_cfg or {}))
        self.cfg = EngineConfig(**engine_cfg)
        self.http = BoundedHttp.from_config(self.cfg)
        client_kw = dict(num_moe_layers=num_moe_layers, topk=topk, num_experts=num_experts)
        self.client_kw = client_kw
        if self.cfg.kind == "embedded":
            launch = partial(spawn, spec=spec, vocab_path=vocab_path,
                             dtype=self.cfg.dtype, log_path=log_path, batching=self.cfg.batching,
                             batch_invariant=self.cfg.batch_invariant,
                             extra_args=["--kv-slots", str(self.cfg.kv_slots)],
                             emission_dir=None if run_dir is None else str(Path(run_dir) / "emissions"))
            # a recreated engine starts from the newest published weights: the first checkpoint
            # may be gone by then (checkpoint retention), and the engine would exit at startup
            factory = spawn_factory(lambda port: launch(port, checkpoint=self._spawn_checkpoint(checkpoint_dir)),
                                    self.http, **client_kw)
        else:  # external SGLang servers: the pool re-admits a URL once its operator restarts it
            factory = url_factory(self.cfg.urls, self.http, **client_kw)
        self.pool = EnginePool(factory, self.cfg, version=version, checkpoint_dir=checkpoint_dir,
                               pause_mode=pause_mode,  # in_place: fully async, requests span syncs
                               weight_sync=router_weight_sync(self.cfg))
        self.pool.start()

    def wait_until_live(self) -> str:
        """Every engine live, or (distributed sync) healthy and awaiting the first barrier's weights."""
        if not self.pool.weight_sync.admits_alone:
            self.pool.wait_until_ready()
        else:
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

    # --- the weight-sync transaction: the coordinator opens and closes it, the trainer pushes ---
    def open_sync(self, checkpoint_dir: str, version: int) -> list[tuple[int, str]]:
        """Close the gate and pause; the ``(slot, url)`` engines the trainer must push ``version`` to."""
        return self.pool.open_sync(checkpoint_dir, str(version))

    def pushed(self, result: Pushed) -> list[tuple[int, str]]:
        """The trainer's push result; returns the engines to push to again ([]: done)."""
        return self.pool.pushed(result)

    def close_sync(self) -> dict:
        report = self.pool.close_sync()
        return {"duration_s": report.duration_s, "live": list(report.live_slots), "dead": list(report.dead_slots),
                "recreated": list(report.recreated_slots), "aborted": report.num_aborted_in_flight}

    def abort_sync(self, why: str) -> None:
        self.pool.abort_sync(why)

    def describe(self) -> str:
        return self.pool.describe()

    def cache_stats(self) -> dict:
        """The live engines' K/V cache use (``EngineClient.cache_stats``), the fullest engine's: ``kv_cache_peak``
        since the weights the step's batch was sampled with loaded; {} when no engine reports it. Read before the
        step's weight sync (t1ops.campaign.runner), for the step row and health.kv-cache."""
        stats = []
        for i in self.pool.live_slots():
            handle = self.pool.slot(i)
            try:
                stats.append(handle.client.cache_stats())
            except Exception as err:  # a dying engine: the pool's health pings say so, not this read
                telemetry.event("engine.cache_stats_failed", severity="warn", slot=i, error=str(err)[:200])
        stats = [s for s in stats if "kv_cache_peak" in s]
        if not stats:
            return {}
        return {"kv_cache_peak": max(s["kv_cache_peak"] for s in stats),
                "kv_cache_usage": max(s["kv_cache_usage"] for s in stats)}

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
