"""Checkpoint retention: keep the last N steps and every K-th, never what a resume needs.

Applied by the trainer host after each save (docs/campaign.md, "Checkpoint
retention"). Per role directory (``actor``, ``critic``, ``trainer_state``) a
step is kept when it is among that directory's newest ``keep_last`` steps, a
multiple of ``keep_every``, or the **resume point**: the newest step at which
actor, critic (PPO) and trainer state all exist, i.e. the step
``t1ops run --resume`` would load. The newest actor step (the weights the
engines load at the next restart) is always among the last N (N >= 2).

Deletion is atomic per step: the directory is first renamed to a dot-name
(which ``list_steps`` never lists, so a reader sees the step either complete or
gone), then removed; a crash in between leaves only a dot-directory, which the
next pass removes.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from t1ops import telemetry
from t1ops.errors import CheckpointError
from t1ops.guards.checkpoints import list_steps, step_dir_name

# The failure ids of docs/failures.md this guard catches (`t1ops explain ID`): a resume-point save
# must leave every role the run needs at that step, checked right after the save.
CATCHES = {
    "critic-checkpoint-skipped": ("trainer.save_every", "trainer.mode"),
}

ROLES = ("actor", "critic", "trainer_state")
_DELETING = ".deleting-"


@dataclass(frozen=True)
class Retention:
    base: Path
    keep_last: int | None = 3     # None: keep every step
    keep_every: int = 0           # 0: no periodic keep
    needs_critic: bool = True

    def resume_point(self) -> int | None:
        """The step a resume would load (newest common step of the roles it needs), or None."""
        actor, critic, state = (set(list_steps(self.base / r)) for r in ROLES)
        common = actor & state & (critic if self.needs_critic else actor)
        return max(common) if common else None

    def check_saved(self, step: int) -> None:
        """After a resume-point save: every role the run needs holds ``step``, else a CheckpointError
        naming the missing roles (a role skipped silently would leave the resume point behind and
        every later step unresumable; runbooks/critic-checkpoint-skipped.md)."""
        needed = [r for r in ROLES if r != "critic" or self.needs_critic]
        missing = [r for r in needed if step not in list_steps(self.base / r)]
        if missing:
            telemetry.event("checkpoint.incomplete", severity="error", step=step, missing=missing,
                            resume_point=self.resume_point())
            raise CheckpointError(f"the resume-point save of step {step} left no {' or '.join(missing)} checkpoint "
                                  f"in {self.base}: a resume would go back to step {self.resume_point()}; the "
                                  f"{'/'.join(missing)} save was skipped (see runbooks/critic-checkpoint-skipped.md)",
                                  path=str(self.base), step=step)

    def keep(self, steps: list[int], protected: int | None) -> set[int]:
        kept = set(steps if self.keep_last is None else sorted(steps)[-self.keep_last:])
        if self.keep_every:
            kept |= {s for s in steps if s % self.keep_every == 0}
        if protected is not None:
            kept.add(protected)
        return kept

    def apply(self) -> list[str]:
        """Delete what is not kept; return the deleted step directories."""
        protected = self.resume_point()
        deleted = []
        for role in ROLES:
            role_dir = self.base / role
            if not role_dir.is_dir():
                continue
            for stale in role_dir.glob(_DELETING + "*"):  # a deletion a crash interrupted
                shutil.rmtree(stale, ignore_errors=True)
            steps = list_steps(role_dir)
            for step in sorted(set(steps) - self.keep(steps, protected)):
                src = role_dir / step_dir_name(step)
                doomed = role_dir / (_DELETING + src.name)
                os.rename(src, doomed)
                shutil.rmtree(doomed)
                deleted.append(f"{role}/{src.name}")
        if deleted:
            telemetry.event("checkpoint.retention", deleted=len(deleted), resume_point=protected,
                            first=deleted[0])
        return deleted


def disk_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except FileNotFoundError:  # removed by a concurrent retention pass
                pass
    return total
