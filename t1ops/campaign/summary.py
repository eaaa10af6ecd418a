"""The run directory's summary.json and its PNG report.

summary.json: ``{"run_id", "config", "warm_start": {...}, "steps": [{"step",
"reward_mean", "explained_variance", "logprob_gap", "turns_mean", "tokens",
"rollout_s", "train_s", "step_s", "ledger", ...}, ...], "warm_start_loss": [...]}``; rewritten
atomically after every step so a crash leaves the steps completed so far.
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

    def add_step(self, row: dict) -> None:
        missing = [k for k in STEP_KEYS if k not in row]
        if missing:
            raise InputError(f"summary step row lacks {missing}", missing=missing)
        self.steps.append(row)
        self.save()

    def save(self) -> Path:
        path = self.run_dir / "summary.json"
        write_json_atomic(path, {"run_id": self.run_id, "config": self.config, **self.extra, "steps": self.steps})
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

    rows = 3 if async_report.has_staleness(steps) else 2
    fig, axes = plt.subplots(rows, 2, figsize=(10, 3.5 * rows))
    panels = [("reward_mean", "mean reward (CTRF, passed/S)"), ("explained_variance", "critic explained variance"),
              ("logprob_gap", "train-vs-rollout log-prob gap"), ("step_s", "seconds per step")]
    for ax, (key, title) in zip(axes.flat, panels):
        ax.plot(x, [s.get(key) for s in steps], marker="o")
        if key == "step_s":
            ax.plot(x, [s.get("rollout_s") for s in steps], marker=".", label="rollout")
            ax.plot(x, [s.get("train_s") for s in steps], marker=".", label="train")
            ax.legend()
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if rows == 3:
        async_report.draw(axes[2][0], axes[2][1], steps)
    fig.suptitle(f"t1ops run {data.get('run_id', '')}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
