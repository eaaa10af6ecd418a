"""Summarise, print and plot a simulation (`t1ops plan simulate`; docs/scale.md)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from t1ops.plan.inputs import SimConfig
from t1ops.plan.simulate import Run


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def summarise(cfg: SimConfig, runs: list[Run]) -> dict:
    """The prediction, averaged over repeats. Shares are of the simulated wall time."""
    steps = [s for r in runs for s in r.steps]
    wall = sum(r.wall_s for r in runs)
    step_s = sum(s.step_s for s in steps)
    lags: Counter = Counter()
    for r in runs:
        lags.update(r.lags)
    trained_groups = sum(lags.values())
    trials = sum(r.trials for r in runs)
    out = {
        "mode": cfg.pipeline.mode, "steps": cfg.pipeline.steps, "repeats": len(runs),
        "step_s": _mean(s.step_s for s in steps),
        "split_s": {"rollout_wait": _mean(s.rollout_wait_s for s in steps), "train": _mean(s.train_s for s in steps),
                    "sync": _mean(s.sync_s for s in steps), "other": _mean(s.overhead_s for s in steps)},
        "rollout_s": _mean(s.rollout_s for s in steps),
        "trajectories_per_s": sum(s.num_trajectories for s in steps) / step_s if step_s else 0.0,
        "tokens_per_step": _mean(s.tokens for s in steps),
        "idle_share": {"rollout_gpus": 1 - sum(r.engine_busy_s for r in runs) / (wall * cfg.cluster.num_engines),
                       "train_gpus": 1 - sum(r.train_busy_s for r in runs) / wall},
        "step_s_per_step": [round(_mean(r.steps[i].step_s for r in runs), 3) for i in range(len(runs[0].steps))],
    }
    if cfg.pipeline.mode == "one_step":  # the report's closed form, for comparison with the event model
        out["one_step_rule_s"] = max(out["rollout_s"], out["split_s"]["train"]) + out["split_s"]["sync"] + \
            out["split_s"]["other"]
    if cfg.pipeline.mode == "fully_async":
        out["staleness"] = {"lag_groups": {str(k): v for k, v in sorted(lags.items())},
                            "violations": sum(r.violations for r in runs),
                            "violation_share": sum(r.violations for r in runs) / max(1, sum(r.groups_accepted for r in runs)),
                            "max_lag": max(lags) if lags else 0, "groups_trained": trained_groups}
    if cfg.pipeline.mode != "fully_async" and (cfg.rollout.skim_overprovision > 1 or any(r.trials_cancelled for r in runs)):
        out["skim"] = {"cancelled_trial_share": sum(r.trials_cancelled for r in runs) / max(1, trials),
                       "cancelled_trial_s_share": sum(r.trial_s_cancelled for r in runs) /
                       max(1e-9, sum(r.trial_s for r in runs))}
    return out


def render(summary: dict, assumptions: list[str]) -> str:
    s, sp = summary, summary["split_s"]
    lines = [f"mode {s['mode']}, {s['steps']} steps x {s['repeats']} repeats",
             f"  step          {s['step_s']:10.2f} s  (rollout wait {sp['rollout_wait']:.2f}, train {sp['train']:.2f}, "
             f"sync {sp['sync']:.2f}, other {sp['other']:.2f})",
             f"  batch rollout {s['rollout_s']:10.2f} s  (submission to its last trial)",
             f"  throughput    {s['trajectories_per_s']:10.3f} trajectories/s, {s['tokens_per_step']:.0f} tokens per step",
             f"  idle GPU share: rollout side {100 * s['idle_share']['rollout_gpus']:.1f}%, "
             f"train side {100 * s['idle_share']['train_gpus']:.1f}%"]
    if "one_step_rule_s" in s:
        lines.append(f"  one-step rule max(rollout, train) + sync + other = {s['one_step_rule_s']:.2f} s")
    if "staleness" in s:
        st = s["staleness"]
        lines.append(f"  staleness: groups by lag {st['lag_groups']}, violations {st['violations']} "
                     f"({100 * st['violation_share']:.1f}% of accepted groups), max lag {st['max_lag']}")
    if "skim" in s:
        sk = s["skim"]
        lines.append(f"  skim: cancelled tail {100 * sk['cancelled_trial_share']:.1f}% of trials, "
                     f"{100 * sk['cancelled_trial_s_share']:.1f}% of trial-seconds")
    if assumptions:
        lines.append("inputs:")
        lines += [f"  {a}" for a in assumptions]
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    sp = summary["split_s"]
    names = ["rollout_wait", "train", "sync", "other"]
    bottom = 0.0
    for name in names:
        axes[0].bar([0], [sp[name]], bottom=bottom, label=name)
        bottom += sp[name]
    axes[0].set_xticks([])
    axes[0].set_ylabel("seconds per step (mean)")
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{summary['mode']}: step split")
    axes[1].plot(range(1, len(summary["step_s_per_step"]) + 1), summary["step_s_per_step"], marker=".")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("step seconds")
    axes[1].set_title("step time")
    if "staleness" in summary:
        lags = summary["staleness"]["lag_groups"]
        axes[2].bar([int(k) for k in lags], list(lags.values()))
        axes[2].set_xlabel("lag (steps)")
        axes[2].set_ylabel("groups trained")
        axes[2].set_title("staleness")
    else:
        idle = summary["idle_share"]
        axes[2].bar(["rollout", "train"], [100 * idle["rollout_gpus"], 100 * idle["train_gpus"]])
        axes[2].set_ylabel("% of time idle")
        axes[2].set_title("idle GPU share")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
