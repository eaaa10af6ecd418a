"""A training step is applied once: a retried ``train`` call for a step already trained is refused.

SkyRL issue #2035 (github.com/NovaSky-AI/SkyRL/issues/2035): a client retried a trainer call whose
response was lost; the trainer ran the optimizer step again (or accumulated the gradients twice).
``TrainerHost.train(..., step=N)`` asks :class:`StepLedger` before it trains and records ``N`` and
its stats after the step succeeded: a second call for ``N`` (a retry) gets the first call's stats
back without training again (a ``trainer.step_repeated`` event says so); a call for an older step
raises ``DataContractError`` naming both. The weights stay those of one step
(runbooks/retried-train-step.md).

A fresh trainer process (a first run or a resume) starts with an empty ledger: the coordinator's
steps after the resume point are all new to it.
"""
from __future__ import annotations

from t1ops import telemetry
from t1ops.errors import DataContractError

# The failure ids of docs/failures.md this guard catches (`t1ops explain ID`).
CATCHES = {
    "retried-train-step": (),
}


class StepLedger:
    """The newest campaign step this trainer applied (0: none yet) and what it returned."""

    def __init__(self) -> None:
        self.last, self.last_stats = 0, None

    def applied(self, step: int) -> dict | None:
        """Before training ``step``: the stats of that step when it was applied already (a retry: answer
        them, do not train), None for a new step; a DataContractError for an older one."""
        if step == self.last and self.last_stats is not None:
            telemetry.event("trainer.step_repeated", severity="warning", step=step)
            return self.last_stats
        if step < self.last or (step == self.last and self.last_stats is None):
            raise DataContractError(f"train call for step {step}, but this trainer already applied step {self.last}: "
                                    "training it again would repeat an optimizer step; refused. See "
                                    "runbooks/retried-train-step.md", step=step, last=self.last)
        return None

    def done(self, step: int, stats: dict) -> None:
        self.last, self.last_stats = step, stats
