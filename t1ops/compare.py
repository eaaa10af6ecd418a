"""`t1ops compare`: held-out reward at the start and the end of runs, beside its noise (docs/campaign.md,
"Learning evidence").

For each run directory (its summary.json) the held-out evaluations are split into groups:

- ``instances``: evaluation tasks of a family the run trained on (new instances of a trained skill),
- ``held-out families``: evaluation tasks of a family with no training task (no transfer expected).

A task's family is its name without a trailing ``-NNNN`` (``t1ops tasks generate`` names tasks
``FAMILY-NNNN``); a bundled task is its own family. For each group and run: the mean reward of the
first evaluation (step 0: the warm-started weights) and of the last, their difference, and the noise
of that difference, ``2 * sqrt(se_start^2 + se_end^2)`` with ``se`` the standard error of a mean over
that evaluation's per-trial rewards (``std / sqrt(n)``). A rise "holds" when it exceeds the noise
(about a 95% interval for independent trials). Runs are grouped by config: two runs share one when
their configs differ only in ``run.seed``, ``run.name`` and ``run.out_dir``.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from rl.agent.bounded import check_nesting, printable, read_regular, short
from t1ops.errors import InputError
from t1ops.overrides import dotted

IGNORED_KEYS = (("run", "seed"), ("run", "name"), ("run", "out_dir"))
INSTANCES = "instances"
HELD_OUT_FAMILIES = "held-out families"


def family_of(task: str) -> str:
    return re.sub(r"-\d+$", "", task)


@dataclass(frozen=True)
class Point:
    """One group's held-out reward at one evaluation."""

    step: int
    mean: float
    se: float
    n: int


@dataclass(frozen=True)
class Learning:
    """One group of one run: its evaluations and the start-to-end verdict."""

    run: str
    seed: int
    group: str
    families: tuple[str, ...]
    points: tuple[Point, ...]

    @property
    def gain(self) -> float:
        return self.points[-1].mean - self.points[0].mean

    @property
    def noise(self) -> float:
        return 2 * math.sqrt(self.points[0].se ** 2 + self.points[-1].se ** 2)

    @property
    def holds(self) -> bool:
        return self.gain > self.noise

    @property
    def verdict(self) -> str:
        if self.holds:
            return "rise beyond noise"
        return "drop beyond noise" if -self.gain > self.noise else "within noise"


def _mean_se(rewards: list[float]) -> tuple[float, float]:
    n = len(rewards)
    mean = sum(rewards) / n
    if n < 2:
        return mean, math.nan
    var = sum((r - mean) ** 2 for r in rewards) / (n - 1)
    return mean, math.sqrt(var / n)


def _train_families(summary: dict) -> set[str] | None:
    names = summary.get("train_tasks")
    if names is None:  # a run from before train_tasks was recorded: its training pool, if it is here
        pool = Path(summary.get("config", {}).get("rollout", {}).get("tasks_dir") or "")
        if summary.get("config", {}).get("rollout", {}).get("num_train_tasks") is not None or not pool.is_dir():
            return None
        names = [p.name for p in pool.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return {family_of(n) for n in names}


MAX_SUMMARY_BYTES = 64 * 2**20   # a summary.json of a long campaign is a few MiB
# what interpreting a summary.json of the wrong shape raises: a refusal naming the file (issue #51)
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError,
              RecursionError)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a reward")


def load_summary(run_dir: Path) -> dict:
    """A run's summary.json: outside data, so bounded in size and nesting, with no NaN or
    Infinity, and a JSON object; InputError naming the file otherwise."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise InputError(f"{run_dir} has no summary.json: pass run directories written by `t1ops run`",
                         path=str(run_dir))
    try:
        data, _ = read_regular(path, MAX_SUMMARY_BYTES)
        text = data.decode("utf-8")
        deep = check_nesting(text)
        if deep:
            raise ValueError(deep)
        doc = json.loads(text, parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InputError(f"{path}: not a summary.json `t1ops run` writes ({short(e, 160)})", path=str(path)) from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a summary.json `t1ops run` writes (a JSON {type(doc).__name__}, "
                         "not an object)", path=str(path))
    return doc


def learning_of(run_dir: Path) -> list[Learning]:
    """The groups of one run (module doc); InputError when it has fewer than two evaluations, or
    when its summary.json is not one `t1ops run` writes (naming the file and what is wrong)."""
    summary = load_summary(run_dir)
    try:
        return _learning(run_dir, summary)
    except InputError:
        raise
    except _MALFORMED as e:
        path = Path(run_dir) / "summary.json"
        raise InputError(f"{path}: not a summary.json `t1ops run` writes ({type(e).__name__}: {short(e, 120)})",
                         path=str(path)) from None


def _learning(run_dir: Path, summary: dict) -> list[Learning]:
    evals = summary.get("eval", [])
    if not isinstance(evals, list) or not all(isinstance(e, dict) for e in evals):
        raise TypeError("'eval' is not a list of objects")
    if len(evals) < 2:
        raise InputError(f"{run_dir}: {len(evals)} held-out evaluation(s); comparing needs the first and the "
                         "last (set eval.every_steps > 0)", path=str(run_dir))
    seed = int(summary.get("config", {}).get("run", {}).get("seed", 0))
    trained = _train_families(summary)
    if any("eval_trial_rewards" not in e for e in evals):  # an older run: only the whole eval's mean and SE
        points = tuple(Point(e["step"], e["eval_reward_mean"], e["eval_reward_sem"], e["eval_num_trials"])
                       for e in evals)
        return [Learning(str(run_dir), seed, "all held-out tasks", (), points)]
    tasks = sorted(evals[0]["eval_trial_rewards"])
    groups: dict[str, list[str]] = {}
    for t in tasks:
        key = "all held-out tasks" if trained is None else \
            INSTANCES if family_of(t) in trained else HELD_OUT_FAMILIES
        groups.setdefault(key, []).append(t)
    out = []
    for key in (INSTANCES, HELD_OUT_FAMILIES, "all held-out tasks"):
        if key not in groups:
            continue
        points = []
        for e in evals:
            rewards = [r for t in groups[key] for r in e["eval_trial_rewards"].get(t, [])]
            if rewards:
                points.append(Point(e["step"], *_mean_se(rewards), len(rewards)))
        if len(points) >= 2:
            fams = tuple(dict.fromkeys(family_of(t) for t in groups[key]))
            out.append(Learning(str(run_dir), seed, key, fams, tuple(points)))
    return out


def config_key(summary_config: dict) -> str:
    cfg = json.loads(json.dumps(summary_config))
    for section, key in IGNORED_KEYS:
        cfg.get(section, {}).pop(key, None)
    return json.dumps(cfg, sort_keys=True)


def group_runs(run_dirs: list[Path]) -> list[tuple[str, list[Path]]]:
    """(label, runs) per distinct config, in first-seen order; a label names how it differs from the first."""
    keyed: dict[str, list[Path]] = {}
    for d in run_dirs:
        cfg = load_summary(d).get("config", {})
        if not isinstance(cfg, dict):
            raise InputError(f"{Path(d) / 'summary.json'}: 'config' is not an object", path=str(d))
        keyed.setdefault(config_key(cfg), []).append(Path(d))
    keys = list(keyed)
    first = dotted(json.loads(keys[0]))
    labels = []
    for i, k in enumerate(keys):
        flat = dotted(json.loads(k))
        diff = [f"{name}={flat.get(name)}" for name in sorted(set(flat) | set(first))
                if flat.get(name) != first.get(name)]
        labels.append(f"config {chr(65 + i) if i < 26 else i}" + (f" ({', '.join(diff[:4])})" if diff else ""))
    return list(zip(labels, keyed.values()))


def format_rows(label: str, rows: list[Learning]) -> list[str]:
    lines = [f"{label}: {len({r.run for r in rows})} run(s)"]
    lines.append(f"  {'seed':>4}  {'group':<18} {'start':>6} {'end':>6} {'gain':>7} {'noise':>6}  verdict"
                 "   (start: step 0, the warm start; end: the last eval; n trials)")
    for r in rows:
        p0, p1 = r.points[0], r.points[-1]
        fams = f"  [{', '.join(r.families)}]" if r.group == HELD_OUT_FAMILIES else ""
        lines.append(f"  {r.seed:>4}  {r.group:<18} {p0.mean:6.3f} {p1.mean:6.3f} {r.gain:+7.3f} {r.noise:6.3f}  "
                     f"{r.verdict} (step {p0.step} n {p0.n} -> step {p1.step} n {p1.n}){fams}")
    for group in dict.fromkeys(r.group for r in rows):
        these = [r for r in rows if r.group == group]
        lines.append(f"  {group}: rise beyond noise on {sum(r.holds for r in these)}/{len(these)} runs, "
                     f"mean gain {sum(r.gain for r in these) / len(these):+.3f}")
    return lines


def plot(configs: list[tuple[str, list[Learning]]], out: Path) -> Path:
    """Held-out reward per evaluation, one panel per (config, group), a line per run, +-2 SE bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(label, g, [r for r in rows if r.group == g])
              for label, rows in configs for g in dict.fromkeys(r.group for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (label, group, rows) in zip(axes[0], panels):
        for r in rows:
            ax.errorbar([p.step for p in r.points], [p.mean for p in r.points],
                        yerr=[2 * p.se if math.isfinite(p.se) else 0 for p in r.points], marker="o", capsize=3,
                        label=f"seed {r.seed}: {r.gain:+.3f} (noise {r.noise:.3f})")
        ax.set_title(f"{label}\n{group}", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("held-out reward (+-2 SE)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def compare(run_dirs: list[Path], out: Path | None) -> tuple[list[str], list[tuple[str, list[Learning]]]]:
    """The printed lines and the rows per config (module doc); draws ``out`` when given."""
    if not run_dirs:
        raise InputError("name at least one run directory", argument="RUN_DIR")
    configs = [(label, [r for d in dirs for r in learning_of(d)]) for label, dirs in group_runs(run_dirs)]
    lines = [printable(line) for label, rows in configs for line in format_rows(label, rows)]   # task names: data
    lines.append("noise = 2 x standard error of the difference of the two means (per-trial rewards)")
    if out is not None:
        lines.append(f"wrote {plot(configs, out)}")
    return lines, configs
