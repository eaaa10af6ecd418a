"""The staleness panels of report.png: tokens by version lag, and each step's group accounting."""
from __future__ import annotations

LAG_TITLE = "loss tokens by version lag (trainer - sampler)"
GROUPS_TITLE = "groups per step (fully async)"
_GROUP_SERIES = (("groups_trained", "trained"), ("groups_dropped_zero_variance", "dropped: zero variance"),
                 ("groups_failed", "failed"), ("groups_in_flight", "in flight"),
                 ("staleness_violations", "staleness violations"))


def has_staleness(steps: list[dict]) -> bool:
    """Rows carry tokens by version lag (one_step and fully_async runs)."""
    return any("version_lag_tokens" in s for s in steps)


def has_group_books(steps: list[dict]) -> bool:
    """Rows carry the group books (fully_async runs only)."""
    return any(key in s for s in steps for key, _ in _GROUP_SERIES)


def draw_lags(ax, steps: list[dict]) -> None:
    """Loss tokens per step stacked by version lag."""
    x = [s["step"] for s in steps]
    lags = sorted({int(k) for s in steps for k in s.get("version_lag_tokens", {})})
    bottom = [0] * len(steps)
    for lag in lags:
        h = [s.get("version_lag_tokens", {}).get(str(lag), 0) for s in steps]
        ax.bar(x, h, bottom=bottom, label=f"lag {lag}")
        bottom = [b + v for b, v in zip(bottom, h)]
    if lags:
        ax.legend(fontsize=7)


def draw_groups(ax, steps: list[dict]) -> None:
    """Groups trained / dropped for zero variance / failed / in flight at batch time, and staleness
    violations (fully async rows)."""
    x = [s["step"] for s in steps]
    for key, label in _GROUP_SERIES:
        if any(key in s for s in steps):
            ax.plot(x, [s.get(key, 0) for s in steps], marker="o", label=label)
    ax.legend(fontsize=7)
