"""skim-tail-bias: skim over-sampling cancels the hardest task families.

Fault (real pacing): the production rollout worker (``RolloutWorker.rollout``)
runs 16 one-trial groups of four task families in real sandboxes with real
verifiers; the "hard" family's work takes seconds longer (its command builds
for ``HARD_S``). Skim launches 16 groups and accepts the first 12 to finish
(``accept_groups``, the campaign's ``skim_overprovision`` = 1.33); the tail is
cancelled at its next turn boundary. The policy is a scripted responder that
answers each task's own solution as a tool call (the subject is pacing, not
sampling).

Unguarded: the accepted batch holds none of the hard family although it was a
quarter of the launches, and the rollout returns without a word.
Guarded: the worker's ``SkimAccounting`` (``t1ops.guards.pacing``) books every
group per family and raises the ``skim.tail_bias`` alarm naming the family at
the end of the rollout that biased the batch. Runbook: ``runbooks/skim-tail-bias.md``.
"""
from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from t1ops import telemetry

FAMILIES = ("files", "text", "json", "hardbuild")
GROUPS_PER_FAMILY, ACCEPT = 4, 12
HARD_S = 6.0
REPO = Path(__file__).resolve().parents[2]


def _tasks(root: Path) -> list[str]:
    """Harbor-layout tasks (a copy of files-hello per family; the hard family's command is slow)."""
    names = []
    for fam in FAMILIES:
        for k in range(GROUPS_PER_FAMILY):
            d = root / f"{fam}-{k}"
            shutil.copytree(REPO / "examples" / "tasks" / "files-hello", d)
            toml = d / "task.toml"
            toml.write_text(toml.read_text().replace('family = "files"', f'family = "{fam}"'))
            if fam == "hardbuild":
                solve = d / "solution" / "solve.sh"
                solve.write_text(solve.read_text().replace("echo hello", f"sleep {HARD_S} && echo hello"))
            names.append(d.name)
    return names


class _Scripted:
    """Turn 0: the task's solution as a bash tool call; turn 1: "Done." (ends the episode)."""

    def __init__(self, worker) -> None:
        self.worker = worker

    def generate(self, req):
        from rl.agent.loop import solution_command, tool_call_text
        from rl.chat import IM_END_ID
        from rl.engines.protocol import FinishReason, GenerateResponse

        task = req.rid.split("-g", 1)[1].rsplit("-s", 1)[0].split("-", 1)[1]
        text = tool_call_text(solution_command(self.worker.tasks[task].solution)) \
            if req.rid.endswith("-t0") else "Done."
        ids = tuple(self.worker.renderer.encode(text) + [IM_END_ID])
        return GenerateResponse(output_ids=ids, finish_reason=FinishReason(type="stop", matched=IM_END_ID),
                                weight_version="0", prompt_tokens=len(req.input_ids), completion_tokens=len(ids),
                                output_token_logprobs=tuple(-0.1 for _ in ids))


@register("skim-tail-bias", "skim over-sampling cancels the hardest task families")
def run(tmp: Path) -> Outcome:
    from rl.agent.loop import AgentSettings
    from t1ops.campaign.worker import RolloutWorker, TrialSpec, WorkerSettings
    from t1ops.config import RolloutConfig

    names = _tasks(tmp / "tasks")
    settings = WorkerSettings(agent=AgentSettings(max_turns=2, max_new_tokens=64), rollout=RolloutConfig(
        max_concurrency=len(names), sandbox_rate_per_s=100.0, reward_scale=5.0, seed_requests=False))
    worker = RolloutWorker(run_id="skim", trials_root=str(tmp / "trials"), tasks_dir=str(tmp / "tasks"),
                           settings=settings, router=None)
    worker.engines = _Scripted(worker)
    groups = [[TrialSpec(t, f"st1-g{i}-{t}", 0)] for i, t in enumerate(names)]
    since = time.time()
    t0 = time.monotonic()
    out = asyncio.run(worker.rollout(1, groups, accept_groups=ACCEPT))
    rollout_s = time.monotonic() - t0
    alarms = telemetry.recent_events("skim.tail_bias", since=since)
    tl = Timeline()  # wall clock, from the rollout's start (the skim cancels from its first accepted groups)
    tl.fault(at=since)
    tl.after_fault(detected=alarms[0]["time"] - since if alarms else None, healthy=time.time() - since)
    kept = [r.family for r in out.results]
    hard_launch = GROUPS_PER_FAMILY / len(names)
    hard_kept = kept.count("hardbuild") / max(1, len(kept))
    books = out.ledger
    return Outcome(
        fault_fired=out.skim["cancelled"].get("hardbuild", 0) > 0,
        unguarded=(f"batch of {len(kept)} accepted, {books['cancelled']} cancelled; hardbuild was "
                   f"{hard_launch:.0%} of launches but {hard_kept:.0%} of the batch; the rollout returned normally"),
        guarded=Guarded(caught=bool(alarms) and "hardbuild" in alarms[-1]["families"], detection_s=round(rollout_s, 3),
                        error=f"skim.tail_bias alarm: {alarms[-1]['families'] if alarms else '(none)'}"),
        invariants={"unguarded_batch_underrepresents_hard_family": hard_kept < hard_launch / 2,
                    "every_trial_accounted": books["expected"] == len(names) == books["completed"]
                    + books["failed"] + books["cancelled"] and books["missing"] == 0,
                    "no_false_alarm_on_fast_families": bool(alarms) and all(
                        f.split("=")[0] == "hardbuild" for f in alarms[-1]["families"].split(", "))},
        details={"skim": out.skim, "ledger": books, "accepted_families": kept, "rollout_s": round(rollout_s, 2)},
        recovery=tl.recovery(trials_lost=books["cancelled"], how="a warning: the step completes; the skim's share is "
                                                                  "lowered by the runbook (not measured)"))
