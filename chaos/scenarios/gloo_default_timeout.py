"""gloo-default-timeout: a slow rank at the weight-update barrier outlives Gloo's default.

Fault (real): a 2-rank data-parallel trainer (``chaos.rank_job``: real
``RankTrainer`` processes on megatron-core over gloo) takes a real training
step; then rank 1 is 45 "minutes" late at the collective ``TrainerHost.publish``
runs inside the weight-update barrier at a resume point (the checkpoint save by
shard, ``save_sharded``: rank 0 gathers every rank's entry and commits) while
rank 0 waits inside it. Time is scaled
8 s : 30 min: torch's built-in Gloo default of 30 min is 8 s, the report's
60 min control-group timeout is 16 s, the stall 12 s: 4 s either side, for either
rank finishing its training step later than the other on a loaded host (at 4 s : 30 min a 2 s margin failed once in CI with
the suite and 50 pause tests on the 2 cores, docs/testing.md "Flakes").

Unguarded: the groups are created without a timeout argument, so torch's
implicit default applies (``default_pg_timeout``, shortened through that very
knob to its scaled 8 s); rank 0's gather raises "Timed out" and the step's
checkpoint is never committed (the barrier fails: the weights never reach the engines). Guarded: every group comes from
``t1ops.guards.dist`` (via ``join_world``) with ``timeout_for("gloo", guards)``,
the gather completes, and rank 0's collective watch reports it slow
(``dist.collective_slow``), not dead.
"""
from __future__ import annotations

from pathlib import Path

from chaos import rank_job
from chaos.harness import Guarded, Outcome, Timeline, register
from t1ops.config import GuardsConfig
from t1ops.guards.dist import timeout_for

SCALE_S_PER_MIN = 8.0 / 30.0   # 30 min -> 8 s
BUILTIN_DEFAULT_MIN = 30.0     # torch.distributed.constants.default_pg_timeout (Gloo)
STALL_MIN = 45.0               # longer than the default, shorter than the report's 60 min
LAYOUT = {"dp": 2, "max_tokens_per_gpu": 64}


def _job(tmp: Path, guarded: bool) -> list[dict]:
    out = tmp / ("guarded" if guarded else "unguarded")
    minutes = timeout_for("gloo", GuardsConfig()).total_seconds() / 60 if guarded else BUILTIN_DEFAULT_MIN
    cfg = {"guarded": guarded, "layout": LAYOUT, "timeout_s": minutes * SCALE_S_PER_MIN, "fault_rank": 1,
           "stall_before_gather_s": STALL_MIN * SCALE_S_PER_MIN, "steps": 1}
    return rank_job.results(out, rank_job.spawn(out, cfg))


@register("gloo-default-timeout", "Gloo's built-in 30 min timeout kills a slow weight-update barrier")
def run(tmp: Path) -> Outcome:
    unguarded = _job(tmp, guarded=False)
    guarded = _job(tmp, guarded=True)
    stall_s = STALL_MIN * SCALE_S_PER_MIN
    u0, g0 = unguarded[0], guarded[0]
    # the fault fired: both ranks really trained, then rank 1 arrived late at the gather rank 0 was in
    fault_fired = all(r.get("steps_done") == 1 for r in unguarded + guarded)
    lost = u0["returncode"] != 0 and "Timed out" in (u0.get("error") or "") and (u0.get("gather_s") is None)
    slow = [s for s in g0.get("slow", []) if s["collective"].startswith("sharded checkpoint save")]
    caught = all(r["error"] is None and r["returncode"] == 0 for r in guarded) and bool(slow)
    tl = Timeline()  # rank 0's own clock: 0 = it entered the gather its late peer had not reached
    tl.fault(at=0.0)
    tl.after_fault(detected=slow[0]["slow_at_s"] if slow else None, healthy=g0.get("gather_s") if caught else None)
    return Outcome(
        fault_fired=fault_fired,
        unguarded=(f"rank 0 died in the checkpoint save's gather inside the weight-update barrier (exit "
                   f"{u0['returncode']}): {u0.get('error')}; the step never reached the engines"),
        guarded=Guarded(caught=caught, detection_s=slow[0]["slow_at_s"] if slow else None,
                        error=(f"the checkpoint save's gather waited {slow[0]['slow_at_s']:.1f} s of its "
                               f"{g0.get('timeout_s', 0):g} s timeout (guards.gloo_timeout_min = 60 min, scaled): "
                               "a peer rank is slow, not dead") if slow else "no slow report"),
        invariants={
            "unguarded: the implicit default fired in the real gather and the step was lost": lost,
            "configured timeout held: both ranks finished the gather": all(r["error"] is None for r in guarded),
            "gather outlived the built-in default": (g0.get("gather_s") or 0) > BUILTIN_DEFAULT_MIN * SCALE_S_PER_MIN,
            "reported slow before the configured timeout": bool(slow) and slow[0]["slow_at_s"] < g0["timeout_s"],
            "rank 0 committed the step's checkpoint": g0.get("committed") is not None,
        },
        details={"unguarded": unguarded, "guarded": guarded, "stall_s": stall_s,
                 "scale": "8 s per 30 min: built-in default 30 min -> 8 s, configured 60 min -> 16 s, stall 45 min -> 12 s"},
        recovery=tl.recovery(how="in place: the gather completes within the configured timeout"),
    )
