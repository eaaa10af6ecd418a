"""skim-tail-bias: skim over-sampling cancels the hardest task families.

Fault (real): 24 trials run as real subprocesses; the "hard" family takes
longer. Skim launches 1.5x the batch, accepts the first ``batch`` to finish
and kills the tail. The accepted batch silently under-represents the hard
family (the report: "the cancelled tail concentrates precisely the hardest task
families").

Guard: ``SkimAccounting`` records per-family acceptance and raises the
``skim.tail_bias`` alarm naming the family.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, register
from t1ops import telemetry
from t1ops.guards.pacing import SkimAccounting

FAMILIES = {"files": 0.05, "text": 0.08, "json": 0.1, "hard-build": 0.6}  # seconds per trial


async def _skim(batch: int, launched: list[str]) -> tuple[list[str], list[str]]:
    """Run one real `sleep` process per trial; accept the first `batch`, kill the rest."""
    procs = {}
    for i, fam in enumerate(launched):
        procs[i] = await asyncio.create_subprocess_exec("sleep", str(FAMILIES[fam]))
    waiters = {asyncio.ensure_future(p.wait()): i for i, p in procs.items()}
    accepted: list[str] = []
    pending = set(waiters)
    while len(accepted) < batch and pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        accepted += [launched[waiters[d]] for d in done]
    # Several trials can finish in one wake-up: those past the cut-off are not accepted, but they
    # are accounted (as cancelled), never forgotten.
    accepted, cancelled = accepted[:batch], accepted[batch:]
    for fut in pending:
        i = waiters[fut]
        if procs[i].returncode is None:
            try:
                procs[i].kill()
            except ProcessLookupError:  # finished after the cut-off: still not accepted
                pass
        await procs[i].wait()
        cancelled.append(launched[i])
    return accepted, cancelled


@register("skim-tail-bias", "skim over-sampling cancels the hardest task families")
def run(tmp: Path) -> Outcome:
    launched = [fam for fam in FAMILIES for _ in range(6)]  # 24 trials, 6 per family
    batch = 16  # 24 = 1.5x over-sampling
    accepted, cancelled = asyncio.run(_skim(batch, launched))
    hard_launch_share = launched.count("hard-build") / len(launched)
    hard_accept_share = accepted.count("hard-build") / len(accepted)
    fault_fired = hard_accept_share < hard_launch_share / 2
    unguarded = (f"batch of {len(accepted)} accepted, {len(cancelled)} cancelled; hard-build was "
                 f"{hard_launch_share:.0%} of launches but {hard_accept_share:.0%} of the batch, and nothing said so")

    t0 = time.monotonic()
    acct = SkimAccounting()
    for fam in accepted:
        acct.record(fam, accepted=True)
    for fam in cancelled:
        acct.record(fam, accepted=False)
    biased = acct.check()
    detection_s = time.monotonic() - t0
    alarm = telemetry.recent_events("skim.tail_bias")
    return Outcome(
        fault_fired=fault_fired, unguarded=unguarded,
        guarded=Guarded(caught="hard-build" in biased and bool(alarm), detection_s=detection_s,
                        error=f"skim.tail_bias alarm: {alarm[-1]['families'] if alarm else '(none)'}"),
        invariants={"unguarded_batch_underrepresents_hard_family": hard_accept_share < hard_launch_share / 2,
                    "every_trial_accounted": sum(acct.launched.values()) == len(launched),
                    "no_false_alarm_on_fast_families": all(f == "hard-build" for f in biased)},
        details={"accepted": dict(acct.accepted), "cancelled": dict(acct.cancelled)})
