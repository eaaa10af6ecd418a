"""The engine pool's proofs at the weight-sync barrier: keys of ``[engine]`` (docs/engine.md).

Kept out of :mod:`t1ops.config` (which :class:`~t1ops.config.EngineConfig` inherits these from)
so the typed config stays small; the keys are plain ``engine.*`` keys, validated the same way.

- ``verify_weights`` / ``weight_resyncs`` (weight-sync-corruption): after a publish every engine
  reports a checksum per tensor it loaded; a mismatch keeps it out of traffic and re-syncs it.
- ``resume_probe`` / ``resume_deadline_s`` (engine-left-paused): every engine must acknowledge
  ``/continue_generation`` and generate a probe token within the deadline, else it is recreated.
- ``failure_threshold`` & co. (engine health) also bound swallowed-engine-death: an engine whose
  background loop died answers 503 and is taken out of rotation at once.
"""
from __future__ import annotations

from pydantic import BaseModel, Field


class EngineChecks(BaseModel):
    verify_weights: bool = Field(True, description="After every publish, compare each engine's per-tensor checksums of what it loaded with the trainer's of what it sent (engines without /weights_checksum are skipped with a warning); a mismatch keeps the engine out of traffic and re-syncs it.")
    weight_resyncs: int = Field(1, ge=0, le=10, description="Re-syncs of an engine whose loaded weights mismatch before it is declared dead and recreated.")
    resume_probe: bool = Field(True, description="After the barrier's continue, prove every engine resumed: a one-token probe /generate must finish within resume_deadline_s, else the engine is recreated.")
    resume_deadline_s: float = Field(10.0, gt=0, le=3600, description="Seconds an engine has to acknowledge /continue_generation and finish the probe generation after a weight sync.")
