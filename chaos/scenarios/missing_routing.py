"""missing-routing: an engine answers one trial without routed experts.

Fault (real, production path): a real embedded engine process started in chaos
mode (``--chaos --chaos-omit-routing-for RID_REGEX``, a switch the engine
refuses without ``--chaos``) answers the first turn of one trial without
``meta_info.routed_experts``. Everything between the engine and the ledger is
production code: the worker's ``DirectEngines`` over an ``EnginePool``, the
real ``EngineClient`` parser, the agent loop with ``TitoBuilder``, real
sandboxes and the verifier on the bundled tasks, and
``RolloutWorker._book``'s abort rule (``RolloutWorker.ABORT_ON``).

Unguarded: the same worker with its abort rule off (``ABORT_ON = ()``, the
collector of the report that treats the failed capture like any failed trial):
the rollout returns without error and the batch silently shrinks by one
(dropping conditions the batch on "capture succeeded": T1 report, section 05).
Guarded: the parser raises ``MissingRoutingError`` naming the rid; the worker
re-raises it and the rollout aborts. Runbook: ``runbooks/missing-routing.md``.
"""
from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from rl.errors import MissingRoutingError

TASKS = ("files-hello", "text-upper")
SAMPLES = 2                                    # two groups of two trials per rollout
FAULT_RID = r"^st\d+-g1-.+-s1-t0$"             # first turn of group 1's second trial
REPO = Path(__file__).resolve().parents[2]


def _groups(step: int):
    from t1ops.campaign.worker import TrialSpec

    return [[TrialSpec(t, f"st{step}-g{g}-{t}", s) for s in range(SAMPLES)] for g, t in enumerate(TASKS)]


class _Observed:
    """Wraps the worker's engines to timestamp the first MissingRoutingError (observation only)."""

    def __init__(self, inner) -> None:
        self.inner, self.raised_at = inner, None

    def generate(self, req):
        try:
            return self.inner.generate(req)
        except MissingRoutingError:
            self.raised_at = self.raised_at or time.monotonic()
            raise


def _start(tmp: Path):
    """A real engine in chaos mode behind the production pool and direct client."""
    from rl.agent.tasks import load_pool
    from rl.chat import ChatRenderer
    from rl.engines.client import EngineClient
    from rl.engines.embedded_spawn import spawn
    from rl.model import ModelSpec
    from t1ops.campaign.launch import build_vocab
    from t1ops.config import EngineConfig
    from t1ops.engines.direct import DirectEngines
    from t1ops.engines.slots import spawn_factory
    from t1ops.engines.pool import EnginePool
    from t1ops.guards.http import BoundedHttp

    vocab = build_vocab(load_pool(REPO / "examples" / "tasks"), ChatRenderer.default(), 248_320)
    vocab.save(tmp / "vocab.json")
    spec = ModelSpec(max_seq_len=1024, vocab_size=vocab.size)
    cfg = EngineConfig(num_engines=1)
    http = BoundedHttp.from_config(cfg)
    kw = dict(num_moe_layers=spec.num_layers, topk=spec.moe_router_topk, num_experts=spec.num_experts)
    log = tmp / "engine.log"
    launch = lambda port: spawn(port, spec, vocab_path=tmp / "vocab.json", log_path=log,  # noqa: E731
                                extra_args=["--chaos", "--chaos-omit-routing-for", FAULT_RID])
    pool = EnginePool(spawn_factory(launch, http, **kw), cfg)
    pool.start()
    pool.wait_until_live()
    direct = DirectEngines(pool.view, pool.report_failure, cfg, make_client=lambda url: EngineClient(url, http, **kw))
    return pool, direct, spec, log


def _worker(tmp: Path, direct, spec, name: str):
    from rl.agent.loop import AgentSettings
    from t1ops.campaign.worker import RolloutWorker, WorkerSettings
    from t1ops.config import RolloutConfig

    agent = AgentSettings(max_turns=2, max_new_tokens=24, context_window=1024, num_layers=spec.num_layers,
                          topk=spec.moe_router_topk)  # routing required on every turn (R3), as in the campaign
    worker = RolloutWorker(run_id=name, trials_root=str(tmp / name), tasks_dir=str(REPO / "examples" / "tasks"),
                           settings=WorkerSettings(agent=agent, rollout=RolloutConfig(
                               max_concurrency=4, reward_scale=5.0, seed_requests=False)), router=None)
    worker.engines = _Observed(direct)
    return worker


@register("missing-routing", "an engine returns no routing for one trial: abort, never drop the sample")
def run(tmp: Path) -> Outcome:
    pool, direct, spec, log = _start(tmp)
    try:
        naive = _worker(tmp, direct, spec, "unguarded")
        naive.ABORT_ON = ()  # the seam: the collector without the abort rule
        out = asyncio.run(naive.rollout(1, _groups(1)))
        # the faulted sample's tokens are lost either way: dropped (failed_trials = "drop") or kept as a
        # token-less failed row at reward 0 (failed_trials = "zero", the default since the credit stage)
        kept = [r.sample_id for r in out.results if not r.failed]
        fired_unguarded = len(re.findall(r"chaos: omitted .* rid (\S+)", log.read_text()))

        worker = _worker(tmp, direct, spec, "guarded")
        t0, err, books = time.monotonic(), None, None
        try:
            books = asyncio.run(worker.rollout(2, _groups(2))).ledger
        except MissingRoutingError as e:
            err, aborted_at = e, time.monotonic()
        omitted = re.findall(r"chaos: omitted .* rid (\S+)", log.read_text())
    finally:
        direct.close()
        pool.close()
    raised_at = worker.engines.raised_at
    detection_s = round(aborted_at - raised_at, 4) if err is not None and raised_at else None
    n = len(TASKS) * SAMPLES
    tl = Timeline()  # from the engine's routing-less answer; the rollout aborts: the run stops by design
    if raised_at is not None:
        tl.fault(at=raised_at)
        if err is not None:
            tl.detected(at=aborted_at)
            tl.stopped(at=aborted_at)
    return Outcome(
        fault_fired=fired_unguarded >= 1 and len(omitted) > fired_unguarded,
        unguarded=(f"rollout returned {len(kept)}/{n} samples without error (failed: {out.failed}); "
                   "the trial whose capture failed was dropped from the batch"),
        guarded=Guarded(caught=err is not None, detection_s=detection_s, error=str(err or "")),
        invariants={
            "unguarded_batch_shrank_silently": len(kept) == n - 1 and not any(k.endswith("g1-" + TASKS[1] + "-s1")
                                                                              for k in kept),
            "fault_hit_the_targeted_rid": all(re.match(FAULT_RID, rid) for rid in omitted),
            "guarded_rollout_aborted": err is not None and books is None,
            "error_names_the_rid": err is not None and "st2-g1-" in str(err),
            "detected_after_the_fault": detection_s is not None and detection_s >= 0,
        },
        details={"omitted_rids": omitted, "unguarded_kept": kept, "unguarded_failed": out.failed,
                 "engine_log": str(log)},
        recovery=tl.recovery(how="stopped: the step's rollout aborted (rollout.aborted), no sample dropped; "
                                 "restart after the engine's flags are fixed (runbook): not measured"))
