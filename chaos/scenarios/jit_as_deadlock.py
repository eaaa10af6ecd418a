"""jit-as-deadlock: a rank cold-compiling while its expert-parallel peers wait looks like a hang.

Fault (real): a 2-rank expert-parallel trainer (``chaos.rank_job``: real
``RankTrainer`` processes, megatron-core EP = 2 over gloo). Rank 1 "compiles":
before each of its first forwards it sleeps along the report's warm-up curve
(a 20-minute cold first micro-batch, then 489 s -> 22 s; time scaled 1 s :
300 s), so rank 0 waits inside the MoE dispatcher's real all-gather.

Unguarded: the groups carry the implicit default, torch's NCCL default of
10 min (2 s scaled), set through torch's own knob: rank 0's all-gather times
out while rank 1 is silent (the report's "15 NCCL watchdog timeouts + one
silent rank") and the step is lost. Guarded: the groups come from
``t1ops.guards.dist`` with the configured 30 min (6 s scaled), the step
survives the cold compile, and the coordinator's :class:`RankWatch` (the
campaign's, fed by every rank's progress beacon) classifies the curve as
``warming_up``, never ``hung``.

Hang (guarded, its own job): rank 1 blocks forever inside a forward; rank 0
waits in the all-gather. The watchdog learns its bound from the observed
micro-batches, calls rank 1 hung within it, and dumps the stacks of EVERY
rank: the stuck one in ``_stuck_compiling``, its peer inside the collective.
"""
from __future__ import annotations

import time
from pathlib import Path

from chaos import rank_job
from chaos.harness import Guarded, Outcome, Timeline, register
from t1ops.config import GuardsConfig
from t1ops.errors import HangError
from t1ops.guards.dist import timeout_for
from t1ops.guards.rank_watch import RankProcess, RankWatch, read_progress

SCALE = 1 / 300.0                                    # scenario seconds per report second
CURVE_S = [1200, 489, 250, 120, 60, 22]              # report, section 09: per-micro-batch seconds
NCCL_BUILTIN_S = 600.0                               # torch's NCCL default collective timeout
HANG_SCALE = 1 / 30.0                                # the hang job: 60 s min bound -> 2 s, 30 min timeout -> 60 s
LAYOUT = {"dp": 2, "ep": 2, "max_tokens_per_gpu": 64}


def _scaled_guards(scale: float) -> GuardsConfig:
    g = GuardsConfig()
    return g.model_copy(update={"watchdog_first_step_bound_s": g.watchdog_first_step_bound_s * scale,
                                "watchdog_min_bound_s": g.watchdog_min_bound_s * scale})


def _watch(out: Path, procs, guards: GuardsConfig, deadline_s: float) -> dict:
    """The coordinator's RankWatch over the job's ranks, from the moment both beacons exist."""
    beacons = [out / f"rank{r}.progress" for r in range(len(procs))]
    t_end = time.monotonic() + deadline_s
    while any(read_progress(b) is None for b in beacons) and time.monotonic() < t_end:
        if any(p.poll() is not None for p in procs):
            return {"statuses": [], "hang": None, "never_started": True}
        time.sleep(0.02)
    watch = RankWatch(guards, {r: RankProcess(p.pid, beacons[r], out / f"rank{r}.stacks")
                               for r, p in enumerate(procs)})
    watch.expect_work()
    t0, statuses, first_seen = time.monotonic(), set(), {}
    while any(p.poll() is None for p in procs) and time.monotonic() < t_end:
        try:
            for s in watch.poll().values():
                statuses.add(s.status)
                first_seen.setdefault(s.status, time.monotonic())
        except HangError as err:
            return {"statuses": sorted(statuses | {"hung"}), "hang": str(err), "detection_s": time.monotonic() - t0,
                    "bound_s": max(watch.watchdog.bound_s(r) for r in watch.ranks)}
        time.sleep(0.02)
    return {"statuses": sorted(statuses), "hang": None, "first_seen": first_seen}


def _job(tmp: Path, name: str, cfg: dict, guards: GuardsConfig | None, deadline_s: float = 240.0) -> dict:
    out = tmp / name
    procs = rank_job.spawn(out, {"layout": LAYOUT, "fault_rank": 1, **cfg})
    try:
        watched = _watch(out, procs, guards, deadline_s) if guards is not None else {}
    finally:
        if watched.get("hang"):
            for p in procs:
                p.kill()
    return {**watched, "ranks": rank_job.results(out, procs)}


@register("jit-as-deadlock", "a rank cold-compiling for >30 min looks like a deadlock to a fixed watchdog")
def run(tmp: Path) -> Outcome:
    curve = [s * SCALE for s in CURVE_S]
    configured_s = timeout_for("nccl", GuardsConfig()).total_seconds()
    unguarded = _job(tmp, "unguarded", {"guarded": False, "timeout_s": NCCL_BUILTIN_S * SCALE,
                                        "compile_curve_s": curve, "steps": 2}, None)
    warm = _job(tmp, "guarded-warmup", {"guarded": True, "timeout_s": configured_s * SCALE,
                                        "compile_curve_s": curve, "steps": 2}, _scaled_guards(SCALE))
    hang = _job(tmp, "guarded-hang", {"guarded": True, "timeout_s": configured_s * HANG_SCALE,
                                      "hang_after_forwards": 4, "steps": 2}, _scaled_guards(HANG_SCALE))
    u0 = unguarded["ranks"][0]
    error = hang.get("hang") or ""
    stacks_of = [f"--- rank {r} (pid" in error for r in range(2)]
    lost = u0["returncode"] != 0 and "Timed out" in (u0.get("error") or "") and u0.get("steps_done") == 0
    fault_fired = lost or all(r.get("steps_done") == 2 for r in warm["ranks"])
    tl = Timeline()  # the warm-up job: from the ranks' first forward (the cold compile) on the host's clock
    starts = [r["work_at"] for r in warm["ranks"] if r.get("work_at")]
    firsts = [r["first_step_at"] for r in warm["ranks"] if r.get("first_step_at")]
    if starts:
        tl.fault(at=min(starts))
        tl.after_fault(detected=(warm.get("first_seen") or {}).get("warming_up", min(starts)) - min(starts)
                       if "warming_up" in (warm.get("first_seen") or {}) else None,
                       healthy=max(firsts) - min(starts) if len(firsts) == len(warm["ranks"]) else None)
    caught = (warm.get("hang") is None and "warming_up" in warm.get("statuses", [])
              and "_stuck_compiling" in error and all(stacks_of))
    return Outcome(
        fault_fired=fault_fired,
        unguarded=(f"rank 0 timed out in the all-gather after the implicit {NCCL_BUILTIN_S * SCALE:g} s "
                   f"(NCCL's 10 min, scaled) while rank 1 compiled: {u0.get('error')}; step lost"),
        guarded=Guarded(caught=caught, detection_s=hang.get("detection_s"), error=error[:4000]),
        invariants={
            "unguarded: the implicit default fired inside the real all-gather and the step was lost": lost,
            "configured timeout survived the cold compile: both ranks finished 2 steps":
                all(r.get("steps_done") == 2 and r["error"] is None for r in warm["ranks"]),
            "warm-up classified warming_up": "warming_up" in warm.get("statuses", []),
            "warm-up never called hung": warm.get("hang") is None,
            "hang detected within the learned bound": hang.get("detection_s") is not None
            and hang["detection_s"] <= hang["bound_s"] + 5.0,
            "stacks dumped from every rank": all(stacks_of),
            "stuck rank's stack names the stuck call": "_stuck_compiling" in error,
            "peer's stack shows it waiting inside the collective": "gather" in error.split("--- rank 1")[0],
        },
        details={"unguarded": unguarded, "warmup": {k: v for k, v in warm.items()},
                 "hang": {k: v for k, v in hang.items() if k != "hang"},
                 "scale": "1 s per 300 s: first micro-batch 1200 s (cold compile) -> 4 s, then 489 s -> 22 s; "
                          "NCCL default 600 s -> 2 s, configured 1800 s -> 6 s; hang job 1 s per 30 s"},
        recovery=tl.recovery(how="in place: classified warming_up, the first step finished; a real hang stops with "
                                 + (f"HangError {hang['detection_s']:.1f} s into the watch" if hang.get("detection_s")
                                    else "HangError (not seen)")),
    )
