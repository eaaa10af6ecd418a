"""The run directory's summary.json and its PNG report.

summary.json: ``{"run_id", "config", "warm_start": {...}, "steps": [{"step",
"reward_mean", "explained_variance", "logprob_gap", "turns_mean", "tokens",
"rollout_s", "train_s", "step_s", "ledger", "generate_s", "sandbox_s", "verify_s", "queue_s",
"generate_share", ..., ...}, ...], "eval": [{"step", "eval_reward_mean", "eval_solved_share",
"eval_num_trials", "eval_expected", "eval_failed", "eval_reward_sem", ...}], "warm_start_loss": [...]}``
(the split: docs/tracing.md; the eval: docs/campaign.md); rewritten atomically after every step and
every evaluation so a crash leaves what was completed so far. An evaluation's fields are also copied
into the row of the step whose weights it evaluated (step 0, the warm-started weights, has only its
``eval`` entry). This is the one writer of step rows in every pipeline mode: its ``tracker``
(``t1ops.tracking.Tracker``; docs/tracking.md) gets each row and evaluation after summary.json has it.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl.atomic import publish_file
from t1ops.errors import InputError

STEP_KEYS = ("step", "reward_mean", "explained_variance", "logprob_gap", "turns_mean", "tokens",
             "rollout_s", "train_s", "step_s")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON atomically and durably (``rl.atomic.publish_file``): readers never see half a file."""
    publish_file(path, json.dumps(data, indent=2, default=str))


@dataclass
class Summary:
    run_dir: Path
    run_id: str
    config: dict
    steps: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    evals: list[dict] = field(default_factory=list)
    tracker: Any = None  # t1ops.tracking.Tracker (None: no trackers); never lets a failure through

    def add_step(self, row: dict) -> None:
        missing = [k for k in STEP_KEYS if k not in row]
        if missing:
            raise InputError(f"summary step row lacks {missing}", missing=missing)
        self.steps.append(row)
        self.save()
        if self.tracker is not None:
            self.tracker.step(row)
        if row["step"] % REPORT_EVERY == 0:
            self.refresh_report(row["step"])

    def refresh_report(self, step: int) -> None:
        """Redraw report.png from summary.json so far and hand it to the trackers; a drawing failure
        is an event, never the run's end (the final report is drawn again at the end)."""
        from t1ops import telemetry

        try:
            path = plot(self.run_dir / "summary.json")
        except Exception as err:  # matplotlib on a half-written run: report it, keep training
            telemetry.event("campaign.report_error", severity="warn", step=step, error=f"{type(err).__name__}: {err}")
            return
        if self.tracker is not None:
            self.tracker.report(path, step)

    def add_eval(self, row: dict) -> None:
        """Record one held-out evaluation (``t1ops.campaign.evaluation.eval_row``)."""
        self.evals.append(row)
        for step_row in self.steps:
            if step_row["step"] == row["step"]:
                step_row.update({k: v for k, v in row.items() if k.startswith("eval_")
                                 and k not in ("eval_per_task", "eval_trial_rewards")})
        self.save()
        if self.tracker is not None:
            self.tracker.eval(row)
        if self.steps:
            self.refresh_report(self.steps[-1]["step"])

    def save(self) -> Path:
        path = self.run_dir / "summary.json"
        fallbacks: dict = {}
        for row in self.steps:  # every non-CTRF reward of the run, by source (and why CTRF was not used)
            for k, v in (row.get("reward_fallbacks") or {}).items():
                fallbacks[k] = fallbacks.get(k, 0) + v
        write_json_atomic(path, {"run_id": self.run_id, "config": self.config, **self.extra,
                                 "reward_fallbacks": fallbacks, "steps": self.steps, "eval": self.evals})
        return path


def report_panels(data: dict) -> list[str]:
    """The titles of report.png's panels, in order: only those the run's rows carry data for (a
    one_step run has no group books, so no "groups per step" panel; docs/async.md)."""
    from t1ops.campaign import async_report

    steps = data["steps"]
    titles = [title for _, title in _CURVES] + [SPLIT_TITLE]
    if async_report.has_staleness(steps):
        titles.append(async_report.LAG_TITLE)
    if async_report.has_group_books(steps):
        titles.append(async_report.GROUPS_TITLE)
    return titles


_CURVES = (("reward_mean", "mean reward (CTRF, passed/S)"), ("explained_variance", "critic explained variance"),
           ("logprob_gap", "train-vs-rollout log-prob gap"), ("step_s", "seconds per step"),
           ("solved_share", "solved share"), ("policy_loss", "policy loss (last epoch)"),
           ("clip_fraction", "clip fraction (PPO) / TV-masked share (DPPO)"), ("entropy", "policy entropy (nats/token)"),
           ("actor_grad_norm", "actor grad norm (before clipping)"),
           ("kl_behaviour", "KL to the behaviour policy (k3, last epoch)"))
REPORT_EVERY = 5  # steps between report.png refreshes during a run (and at every evaluation)
SPLIT_TITLE = "where trial time goes (share of trial-seconds)"


def plot(summary_path: Path, out: Path | None = None) -> Path:
    """Render reward, EV, log-prob gap, the optimizer's curves and timings per step into a PNG next to
    summary.json; the staleness panels only when the run produced them (:func:`report_panels`).
    One drawing at a time (evaluations report from their own thread; pyplot is not thread-safe)."""
    with _PLOT_LOCK:
        return _plot(summary_path, out)


_PLOT_LOCK = threading.Lock()


def _plot(summary_path: Path, out: Path | None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from t1ops.campaign import async_report

    data = json.loads(Path(summary_path).read_text())
    steps = data["steps"]
    out = out or Path(summary_path).with_name("report.png")
    x = [s["step"] for s in steps]
    evals = data.get("eval", [])
    titles = report_panels(data)
    rows = -(-len(titles) // 3)
    fig, axes = plt.subplots(rows, 3, figsize=(15, 3.5 * rows))
    drawers = {title: (lambda ax, key=key: _plot_curve(ax, key, x, steps, evals, summary_path))
               for key, title in _CURVES}
    drawers.update({SPLIT_TITLE: lambda ax: _plot_split(ax, steps),
                    async_report.LAG_TITLE: lambda ax: async_report.draw_lags(ax, steps),
                    async_report.GROUPS_TITLE: lambda ax: async_report.draw_groups(ax, steps)})
    for ax, title in zip(axes.flat, titles):
        drawers[title](ax)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(titles):]:
        ax.set_visible(False)
    fig.suptitle(f"t1ops run {data.get('run_id', '')}")
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # room for the title above the first row
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
                    marker=".", linestyle="none", capsize=2, label=f"eval: {g.group}")  # measured points only


def _plot_curve(ax, key: str, x: list, steps: list[dict], evals: list[dict], summary_path: Path) -> None:
    ax.plot(x, [s.get(key) for s in steps], marker="o", label="training batch")
    if key in ("reward_mean", "solved_share") and evals:
        ex = [e["step"] for e in evals]
        ey = [e["eval_" + key] for e in evals]
        err = [e.get("eval_reward_sem") or 0 for e in evals] if key == "reward_mean" else None
        ax.errorbar(ex, ey, yerr=err, marker="s", linestyle="none", capsize=3, label="held-out eval (+- s.e.)")
        if key == "reward_mean":
            _plot_eval_groups(ax, summary_path)
        ax.legend()
    if key == "step_s":
        ax.plot(x, [s.get("rollout_s") for s in steps], marker=".", label="rollout")
        ax.plot(x, [s.get("train_s") for s in steps], marker=".", label="train")
        ax.legend()


def _plot_split(ax, steps: list[dict]) -> None:
    """Stacked shares of the active trial-seconds per step: generate, sandbox, verify, other."""
    x = [s["step"] for s in steps]
    bottom = [0.0] * len(steps)
    for name in ("generate", "sandbox", "verify", "other"):
        values = [s.get(f"{name}_share", 0.0) for s in steps]
        ax.bar(x, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.plot(x, [s.get("queue_share", 0.0) for s in steps], "k.--", label="queued (of all)")
    ax.set_ylim(0, 1.4)  # the legend sits above the bars (at most 1), never on them
    ax.legend(fontsize=7, ncol=3, loc="upper center")
