"""No reward without a verdict: a trial whose verifier never delivered one is failed, not a zero.

Two ways a verifier ends without a verdict for reasons outside the agent's work, each trained as a
real zero elsewhere (runbooks/infra-failure-as-zero.md):

- it outlived its budget (``verifier-timeout``; slow-verifier): rllm #710 reported 76 of 178
  wall-clock timeouts as a clean finish;
- it was killed from outside (a signal it did not raise itself: a spot preemption, the host's OOM
  killer, a node drain) with no verdict written: open-instruct #1887 trained on these "fake zeros"
  in 5-15% of episodes.

:func:`check_verdict` (called by ``RolloutWorker`` right after ``verify_within``) raises for both, so
the trial counts as failed and ``rollout.failed_trials`` decides (drop by default). A verifier that
exited non-zero on its own, or hit a sandbox limit (the agent's solution used too much memory), is
the agent's result and keeps its verdict.
"""
from __future__ import annotations

import signal

from rl.agent.verifier import VerifierResult, verifier_timeout_error
from t1ops.errors import SandboxError

# The failure ids of docs/failures.md this guard catches (`t1ops explain ID`).
CATCHES = {
    "infra-failure-as-zero": ("rollout.failed_trials",),
}

_EXTERNAL = {signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT}


def killed_by(exit_code: int | None) -> int | None:
    """The signal that ended a process (``-N`` from Popen, ``128 + N`` from a shell), else None."""
    if exit_code is None:
        return None
    sig = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else 0
    return sig if sig in _EXTERNAL else None


def check_verdict(task: str, verdict: VerifierResult) -> None:
    """Raise when ``verdict`` holds no verdict for a reason outside the agent's work."""
    if verdict.reason == "verifier-timeout":
        raise verifier_timeout_error(task, verdict)
    sig = killed_by(verdict.exit_code)
    if verdict.reason == "no-verdict" and sig is not None:
        raise SandboxError(
            f"verifier of task {task}, trial {verdict.trial_id} was killed by {signal.Signals(sig).name} before "
            "it wrote a verdict (a preemption, the host's OOM killer, a node drain): an infrastructure failure, not "
            "a zero reward; the trial counts as failed (rollout.failed_trials). See runbooks/infra-failure-as-zero.md")
