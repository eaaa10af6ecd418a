"""infra-failure-as-zero: infrastructure failures trained as real zero rewards.

rllm issue #710 (github.com/rllm-org/rllm/issues/710): 76 of 178 wall-clock timeouts were reported as
a clean finish with reward 0; open-instruct issue #1887 (github.com/allenai/open-instruct/issues/1887):
spot preemptions killed environments mid-episode and the episodes trained as zeros, 5-15% of them.

Fault (real): a Harbor-layout task in a real trial of the local sandbox; while its verifier runs,
every verifier process is SIGKILLed from outside (what a spot preemption, the host's OOM killer or a
node drain does). The verifier writes no verdict.

- Unguarded (the worker as it was: only ``verifier-timeout`` failed a trial): the verdict is
  ``no-verdict``, reward 0, and the trial trains as a real zero in its group.
- Guarded: ``t1ops.guards.infra_verdict.check_verdict`` (``RolloutWorker`` right after
  ``verify_within``) raises: killed by SIGKILL before a verdict is an infrastructure failure; the
  trial counts as failed and ``rollout.failed_trials`` decides (dropped by default). A control trial
  whose verifier runs to the end on an unsolved task keeps its real zero (no false alarm).
"""
from __future__ import annotations

import shutil
import signal
import threading
import time
from pathlib import Path

import psutil

from chaos.harness import Guarded, Outcome, Timeline, register
from t1ops.errors import SandboxError

POOL = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def _task(tmp: Path, name: str, slow: bool):
    from rl.agent.tasks import load_task
    src = tmp / "pool" / name
    shutil.copytree(POOL / "text-sort", src)
    if slow:
        test = src / "tests" / "test.sh"
        lines = test.read_text().splitlines()
        test.write_text("\n".join([lines[0], "sleep 60  # the verifier is running when the node goes", *lines[1:]]) + "\n")
    return load_task(src)


def _preempted_verdict(sandbox, task, tl: Timeline):
    from rl.agent import verifying
    from rl.agent.verifier import run_tag_for, verify_within
    trial = sandbox.create(task, 0)
    box: dict = {}
    th = threading.Thread(target=lambda: box.update(v=verify_within(trial, timeout_cap_s=120)), daemon=True)
    th.start()
    deadline, pids = time.monotonic() + 60, []
    while not pids and time.monotonic() < deadline:
        pids = verifying.verifier_pids(run_tag_for(trial))
        time.sleep(0.1)
    time.sleep(0.5)
    pids = verifying.verifier_pids(run_tag_for(trial)) or pids
    for pid in pids:  # the preemption: every verifier process, from outside
        try:
            psutil.Process(pid).send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    tl.fault()
    th.join(60)
    trial.close()
    return box.get("v"), pids


@register("infra-failure-as-zero", "infrastructure failures (preemption, timeout) trained as real zero rewards")
def run(tmp: Path) -> Outcome:
    from rl.agent.sandbox import Sandbox
    from rl.agent.verifier import verify_within
    from t1ops.guards.infra_verdict import check_verdict

    sandbox = Sandbox(tmp / "trials", "run-infra-zero")
    tl = Timeline()
    verdict, pids = _preempted_verdict(sandbox, _task(tmp, "preempted", slow=True), tl)
    try:
        check_verdict("preempted", verdict)
        err: Exception | None = None
    except SandboxError as e:
        err = e
    tl.detected()
    control_trial = sandbox.create(_task(tmp, "unsolved", slow=False), 1)
    control = verify_within(control_trial, timeout_cap_s=120)
    control_trial.close()
    try:
        check_verdict("unsolved", control)
        control_err = None
    except SandboxError as e:
        control_err = e
    tl.healthy()
    fired = verdict is not None and bool(pids) and verdict.exit_code is not None and verdict.exit_code != 0
    return Outcome(
        fault_fired=fired,
        unguarded=(f"verifier SIGKILLed mid-run (pids {pids}): verdict {verdict.reason if verdict else None!r}, "
                   f"reward {verdict.reward.value if verdict else None} ({verdict.reward.source if verdict else ''}), "
                   f"exit {verdict.exit_code if verdict else None}: trained as a real zero"),
        guarded=Guarded(caught=isinstance(err, SandboxError), detection_s=tl.since_fault("detected"),
                        error=str(err)[:300] if err else "not caught"),
        invariants={
            "unguarded_preempted_trial_is_a_zero_reward": verdict is not None and verdict.reason == "no-verdict"
            and verdict.reward.value == 0,
            "guarded_preempted_trial_fails_not_zero": isinstance(err, SandboxError) and "SIGKILL" in str(err),
            "control_real_zero_kept": control_err is None and control.reason == "ok" and control.reward.value == 0,
        },
        details={"verdict": None if verdict is None else {"reason": verdict.reason, "exit_code": verdict.exit_code,
                                                          "source": verdict.reward.source},
                 "control": {"reason": control.reason, "reward": control.reward.value,
                             "source": control.reward.source}},
        recovery=tl.recovery(trials_lost=1, how="the trial is failed and dropped (rollout.failed_trials); "
                                                "the group trains on the others"))
