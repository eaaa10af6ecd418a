"""The staleness panels of report.png: tokens by version lag, and each step's group accounting."""
from __future__ import annotations


def has_staleness(steps: list[dict]) -> bool:
    return any("version_lag_tokens" in s for s in steps)


def draw(ax_lag, ax_groups, steps: list[dict]) -> None:
    """Left: loss tokens per step stacked by version lag. Right: groups trained / dropped for zero
    variance / failed / in flight at batch time, and staleness violations (fully async rows)."""
    x = [s["step"] for s in steps]
    lags = sorted({int(k) for s in steps for k in s.get("version_lag_tokens", {})})
    bottom = [0] * len(steps)
    for lag in lags:
        h = [s.get("version_lag_tokens", {}).get(str(lag), 0) for s in steps]
        ax_lag.bar(x, h, bottom=bottom, label=f"lag {lag}")
        bottom = [b + v for b, v in zip(bottom, h)]
    ax_lag.set_title("loss tokens by version lag (trainer - sampler)")
    if lags:
        ax_lag.legend(fontsize=7)
    series = [("groups_trained", "trained"), ("groups_dropped_zero_variance", "dropped: zero variance"),
              ("groups_failed", "failed"), ("groups_in_flight", "in flight"),
              ("staleness_violations", "staleness violations")]
    shown = False
    for key, label in series:
        if any(key in s for s in steps):
            ax_groups.plot(x, [s.get(key, 0) for s in steps], marker="o", label=label)
            shown = True
    ax_groups.set_title("groups per step (fully async)" if shown else "groups per step: fully async only")
    if shown:
        ax_groups.legend(fontsize=7)
    for ax in (ax_lag, ax_groups):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
