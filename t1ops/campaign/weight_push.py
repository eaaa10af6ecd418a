"""The trainer's half of the weight-sync transaction: push one version to the engines it is given.

The coordinator owns the transaction (:func:`t1ops.campaign.barrier.engine_barrier`; docs/weights.md,
"One transaction"): it opens the barrier on the router, which names the engines as ``(slot, url)``;
it asks the trainer to :meth:`WeightPush.push_weights` to exactly those; it hands the result back
to the router, which checks what each engine loaded and may name engines to push to again.
Nothing here is called by the router, and the router holds no handle of the trainer.

Mixed into the trainer role (``TrainerHost``, rank 0 of a multi-rank trainer) beside
:class:`rl.weights.sender.WeightSender`, whose exports, buckets and broadcasts it drives through
the same ``WeightSync`` objects the pool uses in one process (:mod:`t1ops.guards.weight_sync`).
"""
from __future__ import annotations

from rl.engines.client import EngineClient
from rl.errors import InputError
from t1ops.config import EngineConfig
from t1ops.guards.http import BoundedHttp
from t1ops.guards.weight_sync import DiskSync, DistributedSync, LocalTrainerSender, Pushed, push


class WeightPush:
    """``configure_weight_push`` once, then ``push_weights(version, targets)`` per barrier."""

    _push_sync = None

    def configure_weight_push(self, *, engine_cfg: dict, client_kw: dict) -> None:
        """``engine_cfg``: the campaign's ``[engine]`` (mode, backend, HTTP bounds); ``client_kw``: the
        routing shape every engine client needs (``num_moe_layers``, ``topk``, ``num_experts``)."""
        cfg = EngineConfig(**engine_cfg)
        self._push_http, self._push_client_kw = BoundedHttp.from_config(cfg), dict(client_kw)
        self._push_clients: dict[str, EngineClient] = {}
        self._push_verify = cfg.verify_weights
        if cfg.weight_sync == "disk":
            self._push_sync = DiskSync(self.weight_export, checksums=self.weight_checksums)
        else:
            backend = cfg.weight_sync_backend or ("gloo" if cfg.kind == "embedded" else "nccl")
            self._push_sync = DistributedSync(LocalTrainerSender(self), backend,
                                              delta=cfg.weight_sync_delta and cfg.kind == "embedded")

    def push_weights(self, version: int, targets: list[tuple[int, str]]) -> Pushed:
        """Bring every ``(slot, url)`` engine to ``version``; what failed, what a new engine can load
        alone, and the checksums of what was pushed."""
        if self._push_sync is None:
            raise InputError("configure_weight_push(engine_cfg=..., client_kw=...) first")
        clients = [(slot, self._client(url)) for slot, url in targets]
        return push(self._push_sync, clients, None, str(version), checksums=self._push_verify)

    def _client(self, url: str) -> EngineClient:
        if url not in self._push_clients:
            self._push_clients[url] = EngineClient(url, self._push_http, **self._push_client_kw)
        return self._push_clients[url]
