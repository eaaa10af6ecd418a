"""Run identity and the run directory layout.

``<out>/<run_id>/``:
  ``config.json``       the validated campaign config
  ``summary.json``      per-step numbers (``t1ops.campaign.summary``)
  ``report.png``        the curves
  ``vocab.json``        the tiny model's compact vocabulary
  ``telemetry/``        OpenTelemetry metrics/spans/events as JSON lines
  ``dumps/``            trajectory dumps of every step, readable by ``t1ops audit``
                        (sample ids carry the step: ``st<step>-g<group>-<task>-s<n>``)
  ``checkpoints/{actor,critic}/step_NNNNNNNN/``  role-separated weights
  ``trials/<run_id>/``  sandboxed trial directories, tagged with the run id
  ``events.out.tfevents.*``  TensorBoard event files; ``wandb/``: offline W&B runs;
  ``tracking.json``: the W&B run id and event offsets a resume continues (docs/tracking.md)
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    run_id: str
    path: Path

    @classmethod
    def create(cls, out_dir: str | Path, name: str) -> "RunDir":
        run_id = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
        path = Path(out_dir).resolve() / run_id
        path.mkdir(parents=True, exist_ok=False)
        return cls(run_id, path)

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def trials_root(self) -> Path:
        return self.path / "trials"

    @property
    def vocab(self) -> Path:
        return self.path / "vocab.json"

    @property
    def dumps(self) -> Path:
        return self.path / "dumps"
