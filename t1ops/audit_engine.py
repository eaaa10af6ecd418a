"""Loss-region drift against the engine's own record (T1 report, section 05).

"0.0000% drift inside the loss region" is a claim about the pipeline: every loss-bearing
id the trainer consumes is the id the engine emitted. A dump's own ``engine_tokens`` are
appended from the same list as ``tokens``, so comparing those two can never fail. This
module compares the dumped (trained) ids with the record the engine process (and the
OpenAI endpoint, for harness trials) wrote on its side, per request
(``rl.engines.emission_log``; the run's ``emissions/`` directory):

- each chunk's ``meta["generations"]`` names the request (``rid``) that emitted each
  stream span ``[start, end)``; the span's ids must equal the record's ``output_ids``;
- a loss-bearing position no generation span covers, or a span whose ids differ from the
  record, is **drift** (named: sample, chunk, position, trained id, engine id);
- a span whose request is in no record is **unverified** (not counted as 0 drift).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rl.engines.emission_log import read_emissions

MAX_NAMED = 20  # drift positions listed by name; the count is always complete


@dataclass
class EngineDrift:
    record: str | None = None         # the emissions directory read (None: none found)
    requests: int = 0                 # generation spans matched with a record
    loss_tokens: int = 0              # loss-bearing positions checked against a record
    drift: int = 0                    # loss-bearing positions whose id is not the engine's
    unverified: int = 0               # loss-bearing positions whose request is in no record
    positions: list[str] = field(default_factory=list)  # the first MAX_NAMED drift positions, named

    def name(self, where: str) -> None:
        self.drift += 1
        if len(self.positions) < MAX_NAMED:
            self.positions.append(where)


def find_record(dump_dir: Path, emissions: Path | None = None) -> Path | None:
    """The emissions directory: ``emissions`` if given, else the run's (``<dump>/../emissions``)."""
    cand = Path(emissions) if emissions is not None else Path(dump_dir).parent / "emissions"
    return cand if cand.is_dir() and any(cand.glob("*.jsonl")) else None


def check_chunk(traj, record: dict, out: EngineDrift, label: str) -> None:
    """Compare one chunk's loss-bearing ids with the engine's record (see the module docstring)."""
    tokens, mask = traj.tokens, traj.loss_mask.astype(bool)
    covered = np.zeros(tokens.shape[0], dtype=bool)
    for rid, start, end in traj.meta.get("generations", []):
        start, end = int(start), int(end)
        covered[start:end] = True
        span_loss = int(mask[start:end].sum())
        by = record.get(str(rid)) if rid is not None else None
        if not by:
            out.unverified += span_loss
            continue
        emitted = np.asarray(by.get("engine", by.get("endpoint")), dtype=np.int64)
        out.requests += 1
        out.loss_tokens += span_loss
        trained = tokens[start:end]
        for k in range(end - start):
            engine_id = int(emitted[k]) if k < emitted.shape[0] else None
            if mask[start + k] and engine_id != int(trained[k]):
                out.name(f"{label} pos {start + k}: trained {int(trained[k])}, engine {engine_id} (rid {rid})")
        if emitted.shape[0] > end - start:  # the engine emitted more than the span holds
            out.name(f"{label} rid {rid}: engine emitted {emitted.shape[0]} ids, the stream holds {end - start}")
    for j in np.flatnonzero(mask & ~covered).tolist():  # loss on a position no request emitted
        out.name(f"{label} pos {j}: loss-bearing id {int(tokens[j])} that no engine request emitted")


def engine_drift(trajectories, record_dir: Path | None) -> EngineDrift:
    """Drift of ``trajectories`` (``(label, Trajectory)`` pairs) against the record in ``record_dir``."""
    out = EngineDrift(record=None if record_dir is None else str(record_dir))
    if record_dir is None:
        return out
    record = read_emissions(record_dir)
    for label, traj in trajectories:
        check_chunk(traj, record, out, label)
    return out
