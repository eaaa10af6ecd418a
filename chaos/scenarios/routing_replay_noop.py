"""routing-replay-noop: routing replay silently does nothing (more routers registered than layers).

verl issue #7340 (github.com/volcengine/verl/issues/7340): with an actor and a reference model in
one process, megatron's global ``RouterReplay.global_router_replay_instances`` held 80 routers for
a 40-layer model; the replay targets went to the first 40 (the reference model's), the actor
routed freely, and R3 was silently off: no error, no warning.

Fault (real): two policies built in one process (the reference first, then the actor), so
megatron's global registry holds 2 x L routers for an L-layer model.

- Unguarded (the global API as verl drove it): the recorded experts go to the first L registered
  routers; the actor's forward runs, its routers' own routing maps (read back by forward hooks)
  differ from the replayed experts: replay did nothing, silently.
- Guarded: ``rl.model.routing.replay_routing`` takes the routers of the model it is given, one per
  layer (``router_replays``: a model holding more routers than layers is a ``RoutingError`` naming
  both counts), so the actor's routing maps are exactly the replayed experts; a model that carries
  a second model's routers (the reference attached as a submodule) is refused with the counts.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from chaos.harness import Guarded, Outcome, Timeline, register
from rl.errors import RoutingError

TOKENS = 12


def _spec():
    from rl.model import ModelSpec
    return ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=32,
                     num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=64, vocab_size=128)


def _targets(actor, ids: torch.Tensor) -> list[np.ndarray]:
    """Experts to replay: the actor's own choice, each shifted to the next expert (so free routing differs)."""
    from rl.model import record_routing, token_logprobs
    with torch.no_grad(), record_routing(actor) as rec:
        token_logprobs(actor, ids[:, :-1], ids[:, 1:])
    spec = actor.t1_spec
    return [(r + 1) % spec.num_experts for r in rec.rows]


def _actor_maps(actor, ids: torch.Tensor) -> list[torch.Tensor]:
    from rl.model import token_logprobs
    from rl.trainer.r3 import _captured_routing_maps
    with torch.no_grad(), _captured_routing_maps(actor) as maps:
        token_logprobs(actor, ids[:, :-1], ids[:, 1:])
    return list(maps)


def _global_replay(actor, targets: list[np.ndarray], ids: torch.Tensor) -> tuple[int, bool]:
    """verl's path: targets handed to the first L routers of megatron's global registry."""
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
    from rl.trainer.r3 import _maps_match_rows
    instances = RouterReplay.global_router_replay_instances
    layers = actor.t1_spec.num_layers
    rows = np.stack(targets)  # [B, T, L, K]
    try:
        for layer, replay in enumerate(instances[:layers]):  # one per layer, in registration order
            replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            replay.set_target_indices(torch.from_numpy(rows[:, :, layer].transpose(1, 0, 2).reshape(-1, rows.shape[-1])))
        maps = _actor_maps(actor, ids)
    finally:
        for replay in instances:
            replay.clear_router_replay_action()
            replay.clear_indices()
    return len(instances), _maps_match_rows(maps, targets, [t.shape[0] for t in targets])


@register("routing-replay-noop", "routing replay silently does nothing: more routers registered than layers")
def run(tmp: Path) -> Outcome:
    from megatron.core.transformer.moe.router_replay import RouterReplay
    from rl.megatron_cpu import init_single_process
    from rl.model import build_policy, replay_routing
    from rl.trainer.r3 import _maps_match_rows

    init_single_process()
    RouterReplay.global_router_replay_instances.clear()  # this scenario's two models only
    tl = Timeline()
    ref = build_policy(_spec(), seed=3).eval()
    actor = build_policy(_spec(), seed=5).eval()
    ids = torch.randint(1, 127, (2, TOKENS), generator=torch.Generator().manual_seed(0))
    targets = _targets(actor, ids)
    lengths = [t.shape[0] for t in targets]
    registered, global_ok = _global_replay(actor, targets, ids)
    tl.fault()
    actor.add_module("reference", ref)  # a model that carries a second model's routers
    t0 = time.monotonic()
    try:
        with replay_routing(actor, targets):
            pass
        err: Exception | None = None
    except RoutingError as e:
        err = e
    detection_s = time.monotonic() - t0
    tl.detected()
    del actor._modules["reference"]
    with replay_routing(actor, targets):
        per_model_ok = _maps_match_rows(_actor_maps(actor, ids), targets, lengths)
    tl.healthy()
    layers = _spec().num_layers
    RouterReplay.global_router_replay_instances.clear()
    return Outcome(
        fault_fired=registered == 2 * layers,
        unguarded=(f"{registered} routers registered for {layers} layers; replay through the global registry "
                   f"targeted the reference model's routers and the actor routed freely "
                   f"(routing maps equal the replayed experts: {global_ok}), no error"),
        guarded=Guarded(caught=isinstance(err, RoutingError) and per_model_ok, detection_s=detection_s,
                        error=str(err)[:300] if err else "not caught"),
        invariants={
            "unguarded_replay_silently_did_nothing": registered == 2 * layers and not global_ok,
            "guarded_replay_uses_the_actor_routers": per_model_ok,
            "extra_routers_refused_with_the_counts": isinstance(err, RoutingError)
            and f"{2 * layers} routers" in str(err) and f"expected {layers}" in str(err),
        },
        details={"registered": registered, "layers": layers},
        recovery=tl.recovery(how="refused at the replay call (before a forward)"))
