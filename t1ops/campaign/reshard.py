"""Resume a trainer at another layout: its optimizer state re-sharded by parameter (docs/parallelism.md,
"Checkpoints by shard").

Weights re-shard tensor by tensor from a checkpoint by shard (``t1ops.guards.sharded_checkpoints``).
The optimizer's state is per rank and numbered by the optimizer's own parameter order, which means
nothing at another layout; so every rank's trainer state also records, in that order, each
parameter's whole-model name and placement (:func:`param_layout`). A resume whose saved layout is
this rank's own loads its file as it is; any other (another world size, or the same size cut
another way) rebuilds each of this rank's parameters' Adam moments from the saved ranks' pieces
(:func:`reshard_optimizer`: joined whole one parameter at a time from memory-mapped files, then cut
to this rank's placement). The step counters and hyperparameters carry over; the RNG state is the
saved rank ``rank % saved world``'s (a stream per rank cannot be re-sharded; RL here draws nothing
from it during the step).
"""
from __future__ import annotations

from typing import Sequence

import torch

from rl.trainer import pipeline as pl
from rl.trainer.shard import Placement

ROLES = (("actor", "actor_optimizer"), ("critic", "critic_optimizer"))


def param_layout(trainer) -> dict[str, list[list]]:
    """``{role: [[whole-model name, full name, dim, index, count, sections], ...]}`` in the order of the
    role's optimizer state (every parameter of every group), for a trainer with models; {} otherwise."""
    out: dict[str, list[list]] = {}
    for role, opt_name in ROLES:
        model, opt = getattr(trainer, role, None), getattr(trainer, opt_name, None)
        if model is None or opt is None or not hasattr(trainer, "_placements"):
            continue
        names = {id(p): n for n, p in model.named_parameters()}
        where, first = trainer._placements(model), model.t1_layers[0]
        rows = []
        for group in opt.param_groups:
            for p in group["params"]:
                n = names[id(p)]
                w = where[n]
                rows.append([pl.global_name(n, first), pl.global_name(w.full_name, first), w.dim, w.index, w.count,
                             list(w.sections)])
        out[role] = rows
    return out


def _placement(row: Sequence) -> Placement:
    return Placement(row[1], row[2], row[3], row[4], tuple(row[5]))


def reshard_optimizer(saved: Sequence[dict], role: str, mine: list[list], current: dict) -> dict:
    """This rank's optimizer ``state_dict`` for ``role`` (``mine``: its :func:`param_layout` rows; ``current``:
    its optimizer's ``state_dict()`` now) from every saved rank's trainer state."""
    opt_key = dict(ROLES)[role]
    pieces: dict[str, dict[int, tuple[dict, Placement]]] = {}
    for state in saved:
        rows, opt = state["params"][role], state[opt_key]
        for j, row in enumerate(rows):
            entry = opt["state"].get(j)
            if entry is not None:
                where = _placement(row)
                pieces.setdefault(where.full_name, {})[where.index if where.dim is not None else 0] = (entry, where)
    new: dict[int, dict] = {}
    for i, row in enumerate(mine):
        have = pieces.get(row[1])
        if not have:
            continue  # never stepped where it was saved: no state, as a fresh optimizer has
        first_entry, saved_where = next(iter(have.values()))
        target = _placement(row)
        entry = {}
        for key, value in first_entry.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                entry[key] = value.clone() if isinstance(value, torch.Tensor) else value  # the step counter
                continue
            whole = value if saved_where.dim is None else saved_where.join(
                [have[k][0][key] for k in range(saved_where.count)])
            entry[key] = (whole if target.dim is None else target.cut(whole)).clone()
        new[i] = entry
    groups = [dict(g) for g in current["param_groups"]]
    saved_groups = saved[0][opt_key]["param_groups"]
    if len(saved_groups) == len(groups):  # the hyperparameters the run had (lr is set again each step)
        for g, s in zip(groups, saved_groups):
            g.update({k: v for k, v in s.items() if k != "params"})
    return {"state": new, "param_groups": groups}
