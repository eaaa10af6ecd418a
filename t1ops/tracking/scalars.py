"""What a tracker sees of a step row: named scalars, grouped into sections, and guard-event text.

Pure functions over the rows ``t1ops.campaign.summary.Summary`` writes (docs/tracking.md): every
numeric leaf of a row becomes one scalar ``<section>/<key>`` (nested books flatten with ``/``,
e.g. ``async/ledger/missing``); the lists of :data:`COUNTED_LISTS` are curves of their length (how many
engines died), any other list (``group_ids``: identifiers) is not a curve; strings and per-id maps
(``group_lags``) are not curves either.
NaN and infinity mean "not defined this step" in a row (EV with constant returns) and are skipped.
"""
from __future__ import annotations

import json
import math
from typing import Any

# Keys a curve cannot show: the step itself, identifiers and per-id maps whose keys grow without bound.
_NOT_CURVES = frozenset({"step", "mode", "group_lags", "violation_lags", "eval_per_task", "eval_trial_rewards",
                         "resume_point", "ranks"})
_REWARD = frozenset({"reward_mean", "solved_share", "no_verdict", "eval_reward_mean", "eval_solved_share",
                     "eval_reward_sem"})
_ASYNC = frozenset({"ledger", "version_lag_tokens", "staleness_alarm", "staleness_violations", "violation_share",
                    "trajectories_spanning_versions"})
_CHECKPOINTS = frozenset({"checkpoint_bytes", "checkpoints_deleted"})
_TIME_SUFFIXES = ("_s", "_share")
COUNTED_LISTS = frozenset({"engines_dead", "engines_recreated"})  # lists whose length is the quantity


def section(key: str) -> str:
    """The chart group a row key belongs to: reward, eval, time, async, engines, checkpoints or train."""
    if key in _REWARD:
        return "reward"
    if key.startswith("eval_"):
        return "eval"
    if key.endswith(_TIME_SUFFIXES) and key not in ("violation_share",) or key == "concurrency":
        return "time"
    if key in _ASYNC or key.startswith("groups_"):
        return "async"
    if key.startswith("engines_"):
        return "engines"
    if key in _CHECKPOINTS:
        return "checkpoints"
    return "train"


def scalars(row: dict[str, Any], *, keys: str = "step") -> dict[str, float]:
    """``{"<section>/<key>[/<sub>...]": value}`` for every finite numeric leaf of ``row``.

    ``keys``: "step" takes a step row's own fields (its ``eval_*`` copies are logged by the
    evaluation itself, at the step it evaluated); "eval" takes only the ``eval_*`` fields."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in _NOT_CURVES or (key.startswith("eval_") != (keys == "eval")):
            continue
        _leaves(f"{section(key)}/{key}", value, out)
    return out


def _leaves(tag: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for sub, v in value.items():
            _leaves(f"{tag}/{sub}", v, out)
    elif isinstance(value, (list, tuple)):  # COUNTED_LISTS (engines_dead: the slots): the curve is how many;
        if tag.rsplit("/", 1)[-1] in COUNTED_LISTS:  # any other list holds identifiers (group_ids): no curve
            out[tag] = float(len(value))
    elif isinstance(value, bool):
        out[tag] = float(value)
    elif isinstance(value, (int, float)) and math.isfinite(value):
        out[tag] = float(value)


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """The campaign config as dotted hyperparameters (``trainer.actor_lr``); lists and None as text."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, prefix=f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value, default=str)
    return out


def events_markdown(events: list[dict]) -> str:
    """Guard events (telemetry records of severity warn/error) as one Markdown list for a text panel."""
    lines = []
    for e in events:
        attrs = ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "name", "severity", "role"))
        where = f" [{e['role']}]" if e.get("role") else ""
        lines.append(f"- **{e['severity']}** `{e['name']}`{where}" + (f": {attrs}" if attrs else ""))
    return "\n".join(lines)
