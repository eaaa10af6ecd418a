"""Per-token shares by how each position entered the stream, from the recorded relations.

Every chunk's ``meta["turn_spans"]`` (written by ``rl.tito.TitoBuilder``) lists
``[start, end, relation]``: the positions each turn added and the relation its
prompt had to the harness's previous view (strict / normalized / retokenized /
split). Each position gets exactly one class, strongest evidence first:

- ``placeholder``: its routing row was borrowed from a neighbour (origin 2);
- ``retokenized``: its later conditioning differed from what the harness sent
  (origin 1: dropped by a normalized repair or re-split by a retokenized turn),
  or a retokenized turn added it;
- ``normalized`` / ``split``: added by a turn with that relation;
- ``aligned``: added by a strict turn (token-in turns are strict).

Dumps written before turn spans existed count as ``unattributed``. Drift in the
loss region (``tokens != engine_tokens`` where ``loss_mask`` is 1) is counted
per trial too; it must be 0.
"""
from __future__ import annotations

import numpy as np

from rl.tito import PLACEHOLDER, RETOKENIZED, Trajectory

CLASSES = ("aligned", "normalized", "retokenized", "split", "placeholder", "unattributed")
_BY_RELATION = {"strict": "aligned", "normalized": "normalized", "retokenized": "retokenized", "split": "split"}


def classify(traj: Trajectory) -> np.ndarray:
    """One class index (into :data:`CLASSES`) per position of ``traj``."""
    n = len(traj)
    out = np.full(n, CLASSES.index("unattributed"), dtype=np.int8)
    for start, end, relation in traj.meta.get("turn_spans") or []:
        out[int(start):int(end)] = CLASSES.index(_BY_RELATION.get(relation, "unattributed"))
    if not traj.meta.get("turn_spans") and all(r == "strict" for r in traj.meta.get("relations", [])):
        out[:] = CLASSES.index("aligned")
    out[traj.origin == RETOKENIZED] = CLASSES.index("retokenized")
    out[traj.origin == PLACEHOLDER] = CLASSES.index("placeholder")
    return out


def counts(traj: Trajectory) -> dict[str, int]:
    """Positions per class plus loss positions and loss-region drift of one chunk."""
    cls = classify(traj)
    out = {name: int((cls == i).sum()) for i, name in enumerate(CLASSES)}
    loss = traj.loss_mask == 1
    out["positions"] = len(traj)
    out["loss_positions"] = int(loss.sum())
    out["drift_in_loss"] = int((loss & (traj.tokens != traj.engine_tokens)).sum())
    return out


def add(into: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def shares(c: dict[str, int]) -> dict[str, float]:
    """Percent of positions per class, and drift as a percent of loss positions."""
    pos = c.get("positions", 0)
    out = {f"{k}_pct": 100.0 * c.get(k, 0) / pos if pos else 0.0 for k in CLASSES}
    loss = c.get("loss_positions", 0)
    out["drift_in_loss_pct"] = 100.0 * c.get("drift_in_loss", 0) / loss if loss else 0.0
    return out
