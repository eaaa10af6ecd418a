"""timeout-override: a global override silently halves task-declared budgets.

T1 report, section 09 (the off-by-717 incident): "The same incident also had a
global timeout override silently halving task-declared budgets."

Fault: a task declares ``agent.timeout_sec = 12`` (scaled from the report's
3600 s wall); a campaign-wide override of 6 s (half) is set. The agent's
command is slow but valid: ``sleep 7 && sort in.txt > out.txt`` (7 s, inside
the task's own budget). The sleep is a lower bound whatever the load, so the
halved budget always kills it; the 5 s left of the task's budget is for the
jail's start on a loaded host (a 2 s margin failed once in CI at a load
average over 20, docs/testing.md "Flakes").

- Unguarded: the override is applied as given (``allow_lower_timeout=True``,
  the legacy behaviour). Observed: the command is killed by the trial budget
  (``budget_exhausted``) before ``sort`` runs; the real verifier scores 0/4.
- Guarded: the default sandbox keeps the task's 12 s, logs the ignored
  override, the command finishes and the verifier scores 4/4.
"""
from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from rl.agent.sandbox import Sandbox
from rl.agent.tasks import load_task
from rl.agent.verifier import verify

POOL = Path(__file__).resolve().parents[2] / "examples" / "tasks"
TASK_BUDGET_S, OVERRIDE_S, COMMAND = 12.0, 6.0, "sleep 7 && sort in.txt > out.txt"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _task(tmp: Path):
    src = tmp / "pool" / "text-sort"
    shutil.copytree(POOL / "text-sort", src)
    toml = (src / "task.toml").read_text().replace("[agent]\ntimeout_sec = 30.0",
                                                   f"[agent]\ntimeout_sec = {TASK_BUDGET_S}")
    (src / "task.toml").write_text(toml)
    return load_task(src)


def _attempt(tmp: Path, task, *, allow_lower: bool) -> dict:
    sandbox = Sandbox(tmp / ("legacy" if allow_lower else "guarded"), "run-override",
                      agent_timeout_override_s=OVERRIDE_S, allow_lower_timeout=allow_lower)
    t0 = time.monotonic()
    trial = sandbox.create(task, 0)
    detection_s = time.monotonic() - t0
    ran = trial.exec(COMMAND)
    verdict = verify(trial)
    return {"budget_s": trial.budget.timeout_s, "budget_source": trial.budget.source,
            "budget_reason": trial.budget.reason, "exec_reason": ran.reason,
            "exec_s": round(ran.duration_s, 2), "passed": verdict.reward.passed,
            "reward": verdict.reward.value, "detection_s": detection_s, "verdict_s": time.monotonic() - t0}


@register("timeout-override", "a global override silently halves task-declared budgets")
def run(tmp: Path) -> Outcome:
    task = _task(tmp)
    capture = _Capture()
    logger = logging.getLogger("rl.agent.tasks")
    unguarded = _attempt(tmp, task, allow_lower=True)
    logger.addHandler(capture)
    try:
        guarded = _attempt(tmp, task, allow_lower=False)
    finally:
        logger.removeHandler(capture)
    logged = [m for m in capture.messages if "ignored" in m and f"{OVERRIDE_S:g}" in m]
    tl = Timeline()  # from the guarded trial's creation under the lowering override
    tl.fault(at=0.0)
    tl.after_fault(detected=guarded["detection_s"] if logged else None,
                   healthy=guarded["verdict_s"] if guarded["passed"] == 4 else None)
    return Outcome(
        fault_fired=unguarded["budget_s"] == TASK_BUDGET_S / 2 and unguarded["exec_reason"] == "budget_exhausted",
        unguarded=(f"task budget {TASK_BUDGET_S:g}s became {unguarded['budget_s']:g}s; the valid "
                   f"{COMMAND!r} was killed ({unguarded['exec_reason']} after {unguarded['exec_s']}s), "
                   f"reward {unguarded['reward']:.2f} ({unguarded['passed']} passes)"),
        guarded=Guarded(caught=guarded["budget_s"] == TASK_BUDGET_S and bool(logged),
                        detection_s=guarded["detection_s"], error=logged[0] if logged else ""),
        invariants={"unguarded_valid_command_killed_at_half_budget": unguarded["budget_s"] == TASK_BUDGET_S / 2
                    and unguarded["exec_reason"] == "budget_exhausted",
                    "task_budget_kept": guarded["budget_source"] == "task",
                    "slow_valid_command_completes": guarded["exec_reason"] == "ok",
                    "full_reward_when_budget_kept": guarded["passed"] == 4},
        details={"unguarded": unguarded, "guarded": guarded},
        recovery=tl.recovery(how="in place: the override is ignored at trial creation; the trial passes"))
