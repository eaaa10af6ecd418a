"""The run directory's summary.json and its PNG report.

summary.json: ``{"run_id", "config", "warm_start": {...}, "steps": [{"step",
"reward_mean", "explained_variance", "logprob_gap", "turns_mean", "tokens",
"rollout_s", "train_s", "step_s", "ledger", "generate_s", "sandbox_s", "verify_s", "queue_s",
"generate_share", ..., ...}, ...], "eval": [{"step", "eval_reward_mean", "eval_solved_share",
"eval_num_trials", "eval_expected", "eval_failed", "eval_reward_sem", ...}], "warm_start_loss": [...]}``
(the split: docs/tracing.md; the eval: docs/campaign.md); rewritten atomically after every step and
every evaluation so a crash leaves what was completed so far. An evaluation's fields are also copied
into the row of the step whose weights it evaluated (step 0, the warm-started weights, has only its
``eval`` entry).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t1ops.errors import InputError

STEP_KEYS = ("step", "reward_mean", "explained_variance", "logprob_gap", "turns_mean", "tokens",
             "rollout_s", "train_s", "step_s")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via temp file + fsync + rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # never leave a half-written temp file beside summary.json
        os.unlink(tmp)
        raise


@dataclass
class Summary:
    run_dir: Path
    run_id: str
    config: dict
    steps: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    evals: list[dict] = field(default_factory=list)

    def add_step(self, row: dict) -> None:
        missing = [k for k in STEP_KEYS if k not in row]
        if missing:
            raise InputError(f"summary step row lacks {missing}", missing=missing)
        self.steps.append(row)
        self.save()

    def add_eval(self, row: dict) -> None:
        """Record one held-out evaluation (``t1ops.campaign.evaluation.eval_row``)."""
        self.evals.append(row)
        for step_row in self.steps:
            if step_row["step"] == row["step"]:
                step_row.update({k: v for k, v in row.items() if k.startswith("eval_")
                                 and k not in ("eval_per_task", "eval_trial_rewards")})
        self.save()

    def save(self) -> Path:
        path = self.run_dir / "summary.json"
        write_json_atomic(path, {"run_id": self.run_id, "config": self.config, **self.extra, "steps": self.steps,
                                 "eval": self.evals})
        return path


def plot(summary_path: Path, out: Path | None = None) -> Path:
    """Render reward, EV, log-prob gap and timings per step into a PNG next to summary.json."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(summary_path).read_text())
    steps = data["steps"]
    out = out or Path(summary_path).with_name("report.png")
    x = [s["step"] for s in steps]
    from t1ops.campaign import async_report

    evals = data.get("eval", [])
    rows = 3 if async_report.has_staleness(steps) else 2
    fig, axes = plt.subplots(rows, 3, figsize=(15, 3.5 * rows))
    panels = [("reward_mean", "mean reward (CTRF, passed/S)"), ("explained_variance", "critic explained variance"),
              ("logprob_gap", "train-vs-rollout log-prob gap"), ("step_s", "seconds per step"),
              ("solved_share", "solved share")]
    _plot_split(axes.flat[5], steps)
    for ax, (key, title) in zip(axes.flat, panels):
        ax.plot(x, [s.get(key) for s in steps], marker="o", label="training batch")
        if key in ("reward_mean", "solved_share") and evals:
            ex = [e["step"] for e in evals]
            ey = [e["eval_" + key] for e in evals]
            err = [e.get("eval_reward_sem") or 0 for e in evals] if key == "reward_mean" else None
            ax.errorbar(ex, ey, yerr=err, marker="s", capsize=3, label="held-out eval")
            if key == "reward_mean":
                _plot_eval_groups(ax, summary_path)
            ax.legend()
        if key == "step_s":
            ax.plot(x, [s.get("rollout_s") for s in steps], marker=".", label="rollout")
            ax.plot(x, [s.get("train_s") for s in steps], marker=".", label="train")
            ax.legend()
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if rows == 3:
        async_report.draw(axes[2][0], axes[2][1], steps)
        axes[2][2].set_visible(False)
    fig.suptitle(f"t1ops run {data.get('run_id', '')}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _plot_eval_groups(ax, summary_path: Path) -> None:
    """The held-out eval split as `t1ops compare` splits it (instances of trained families, held-out
    families), each with its standard error, when the run recorded per-trial rewards."""
    from t1ops.compare import learning_of

    try:
        groups = learning_of(Path(summary_path).parent)
    except InputError:  # fewer than two evaluations so far: nothing to split yet
        return
    if len(groups) < 2:
        return
    for g in groups:
        ax.errorbar([p.step for p in g.points], [p.mean for p in g.points], yerr=[p.se for p in g.points],
                    marker=".", linestyle="--", capsize=2, label=f"eval: {g.group}")


def _plot_split(ax, steps: list[dict]) -> None:
    """Stacked shares of the active trial-seconds per step: generate, sandbox, verify, other."""
    x = [s["step"] for s in steps]
    bottom = [0.0] * len(steps)
    for name in ("generate", "sandbox", "verify", "other"):
        values = [s.get(f"{name}_share", 0.0) for s in steps]
        ax.bar(x, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.plot(x, [s.get("queue_share", 0.0) for s in steps], "k.--", label="queued (of all)")
    ax.set_title("where trial time goes (share of trial-seconds)")
    ax.set_xlabel("step")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
