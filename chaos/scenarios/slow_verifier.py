"""slow-verifier: a slow reward function stalls the step and looks like a distributed deadlock.

verl issue #6673 (github.com/volcengine/verl/issues/6673): training stalled with the trainer's
ranks waiting in an NCCL collective; the cause was a slow reward function, not NCCL. Fault
(real): a Harbor-layout task whose verifier (``tests/test.sh``) runs ``sleep 3600`` before its
tests, in a real trial of the local backend (namespaces, the trial's own verifier uid and
cgroup); the task declares a generous ``[verifier] timeout_sec = 3600``. Time is scaled:
``guards.field.verifier_timeout_cap_s`` 600 s -> 2 s, ``guards.stall_timeout_s`` 300 s -> 1 s.

Unguarded (the task's own budget, the stall detector without the verifier probe): after
3 x the cap there is still no verdict, the verifier still runs, and the stall report says
only "the in-flight work itself is slow or hung" (no task, trial or pid: the user is left
with the trainer's idle collective). Guarded: the verifier is killed at the capped budget, the
verdict is ``verifier-timeout`` with no reward (the campaign fails the trial:
``rollout.failed_trials`` decides), and the stall report names the verifier's task, trial and
pid before that.
"""
from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import psutil

from chaos.harness import Guarded, Outcome, Timeline, register

POOL = Path(__file__).resolve().parents[2] / "examples" / "tasks"
# a sandboxed verifier takes seconds to start on a loaded 2-core host (soak, --load 1): the cap must
# leave it time to start, or it is killed before its pid exists and nothing can name it
CAP_S, STALL_S, TASK_BUDGET_S = 5.0, 1.0, 3600.0
OUTER_BOUND_S = 3 * CAP_S


def _task(tmp: Path):
    from rl.agent.tasks import load_task

    src = tmp / "pool" / "slow-reward"
    shutil.copytree(POOL / "text-sort", src)
    test = src / "tests" / "test.sh"
    lines = test.read_text().splitlines()
    test.write_text("\n".join([lines[0], "sleep 3600  # the slow reward function", *lines[1:]]) + "\n")
    toml = (src / "task.toml").read_text()
    (src / "task.toml").write_text(toml.replace("[verifier]\ntimeout_sec = 60.0", f"[verifier]\ntimeout_sec = {TASK_BUDGET_S}"))
    return load_task(src)


def _verify_in_background(trial, cap_s: float | None) -> tuple[threading.Thread, dict]:
    from rl.agent.verifier import verify_within

    box: dict = {}
    t = threading.Thread(target=lambda: box.update(v=verify_within(trial, timeout_cap_s=cap_s)), daemon=True)
    t.start()
    return t, box


def _watch(stall, box: dict, bound_s: float) -> tuple[str | None, float | None]:
    """Poll the stall detector as the coordinator does until a verdict or ``bound_s``.

    Returns the newest stall report (the first may precede the verifier's process: a report names
    what it can see) and when the first one came."""
    from t1ops.errors import StallError

    t0 = time.monotonic()
    newest, first_s = None, None
    while "v" not in box and time.monotonic() - t0 < bound_s:
        try:
            stall.check()
        except StallError as err:
            newest = str(err)
            first_s = time.monotonic() - t0 if first_s is None else first_s
        time.sleep(0.1)
    return newest, first_s


@register("slow-verifier", "a slow verifier stalls the step and looks like a distributed deadlock")
def run(tmp: Path) -> Outcome:
    from rl.agent import verifying
    from rl.agent.sandbox import Sandbox
    from rl.agent.verifier import run_tag_for, verifier_timeout_error
    from t1ops.guards.fds import StallDetector
    from t1ops.guards.watchdog import running_verifiers

    task = _task(tmp)
    root = tmp / "trials"
    sandbox = Sandbox(root, "run-slow-verifier")
    # unguarded: the task's own budget; the stall detector without the verifier probe
    trial_u = sandbox.create(task, 0)
    stall_u = StallDetector(STALL_S, what="trials")
    stall_u.on_submit(1)
    thread_u, box_u = _verify_in_background(trial_u, None)
    msg_u, _ = _watch(stall_u, box_u, OUTER_BOUND_S)
    pids_u = verifying.verifier_pids(run_tag_for(trial_u))
    stalled = "v" not in box_u and bool(pids_u)
    for pid in pids_u:   # end the unguarded verifier: the outer bound is this scenario's, not the code's
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    thread_u.join(30)
    # guarded: the capped budget; the stall detector names the running verifiers
    trial_g = sandbox.create(task, 1)
    stall_g = StallDetector(STALL_S, what="trials", busy=lambda: running_verifiers(root))
    stall_g.on_submit(1)
    t0 = time.monotonic()
    thread_g, box_g = _verify_in_background(trial_g, CAP_S)
    msg_g, detected_s = _watch(stall_g, box_g, 60)
    thread_g.join(30)
    verdict = box_g.get("v")
    verdict_s = time.monotonic() - t0
    pids_g = list(verdict.verifier_pids) if verdict else []
    err = str(verifier_timeout_error(task.name, verdict)) if verdict else ""
    left = [p for p in pids_g if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    for t in (trial_u, trial_g):
        t.close()
    tl = Timeline()  # from the guarded verifier's start: the stall report names it; the cap kills it
    tl.fault(at=t0)
    tl.after_fault(detected=detected_s, healthy=verdict_s if verdict is not None else None)
    named = bool(msg_g) and all(s in msg_g for s in (task.name, trial_g.trial_id)) \
        and any(str(p) in msg_g for p in pids_g)
    return Outcome(
        fault_fired=stalled,
        unguarded=(f"no verdict after {OUTER_BOUND_S:g} s (the task's budget: {TASK_BUDGET_S:g} s); the verifier "
                   f"(pids {pids_u}) still ran; the stall report: {(msg_u or 'none')[:200]}"),
        guarded=Guarded(caught=named and verdict is not None and verdict.reason == "verifier-timeout",
                        detection_s=detected_s, error=(msg_g or "")[:700]),
        invariants={
            "unguarded: the step stalled past 3 x the cap with the verifier still running": stalled,
            "unguarded: the stall report names no verifier, task, trial or pid": bool(msg_u) and not any(
                s in msg_u for s in ("verifier", task.name, trial_u.trial_id, *map(str, pids_u))),
            "stall report names the verifier's task, trial and pid": named,
            "killed at the capped budget, not the task's": verdict is not None and verdict.reason == "verifier-timeout"
            and verdict.budget_s == CAP_S and verdict_s < CAP_S + 10,
            "no reward without a verdict": verdict is not None and verdict.reward.source == "no-verdict"
            and "no verdict, so no reward" in err and str(pids_g[0]) in err if pids_g else False,
            "the verifier's processes are gone": not left,
        },
        details={"unguarded_stall": msg_u, "guarded_stall": msg_g, "campaign_error": err,
                 "verdict": None if verdict is None else {"reason": verdict.reason, "source": verdict.reward.source,
                                                          "budget_s": verdict.budget_s, "pids": pids_g},
                 "scale": f"cap 600 s -> {CAP_S:g} s, stall threshold 300 s -> {STALL_S:g} s"},
        recovery=tl.recovery(trials_lost=1, how="in place: the verifier killed at the capped budget, the trial "
                                                "fails without a reward and the step goes on"),
    )
