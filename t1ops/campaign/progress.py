"""The live progress display of `t1ops run` (rich), quiet when not on a terminal."""
from __future__ import annotations

import math
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

from t1ops.campaign.trialtrace import split_text


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


class Progress:
    """One bar over RL steps, its description carrying the step's numbers."""

    def __init__(self, total_steps: int, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self._bar = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=False,
                                 disable=not enabled)
        self._task = self._bar.add_task("starting", total=total_steps)
        self.engines = ""

    def __enter__(self) -> "Progress":
        self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.stop()

    def log(self, text: str) -> None:
        self.console.print(text) if self.enabled else print(text, file=sys.stderr)

    @staticmethod
    def eval_text(ev: dict | None) -> str:
        """``eval@S reward R solved P% n N`` of the latest held-out evaluation (empty when none yet)."""
        if not ev:
            return ""
        failed = f" ({ev['eval_failed']} failed)" if ev.get("eval_failed") else ""
        return (f"eval@{ev['step']} reward {_fmt(ev['eval_reward_mean'])} solved "
                f"{_fmt(100 * ev['eval_solved_share'], '.0f')}% n {ev['eval_num_trials']}/{ev['eval_expected']}{failed}")

    def update(self, *, step: int, phase: str, row: dict | None = None, in_flight: int | None = None,
               engines: str | None = None, evaluation: dict | None = None) -> None:
        self.engines = engines or self.engines
        if row is not None:
            ev = self.eval_text(evaluation)
            desc = (row_text(row, ev) + f" | engines {self.engines}" + _async_part(row)
                    + (f" | ALARM {' '.join(row['health_alarms'])}" if row.get("health_alarms") else ""))
            self._bar.update(self._task, completed=step, description=desc)
            if not self.enabled or not sys.stderr.isatty():
                print(desc, file=sys.stderr, flush=True)
        else:
            self._bar.update(self._task, description=f"step {step}: {phase} (trials in flight {in_flight}) "
                                                     f"| engines {self.engines}")


def row_text(row: dict, eval_text: str = "") -> str:
    """A step row as the step line (`t1ops run`'s progress, `t1ops runs tail`)."""
    critic_only = " critic-only" if row.get("actor_updated") is False else ""
    if row.get("optimizer_skipped"):  # the credit stage found no signal (t1ops.campaign.credit)
        critic_only = " no signal: optimizer step skipped"
    nan = float("nan")
    return (f"step {row['step']}{critic_only} reward {_fmt(row['reward_mean'])} "
            f"EV {_fmt(row['explained_variance'], '.2f')} entropy {_fmt(row.get('entropy', nan), '.3f')} "
            f"gap {_fmt(row['logprob_gap'], '.4f')} turns {_fmt(row['turns_mean'], '.1f')} "
            f"lr {_fmt(row.get('actor_lr', nan), '.1e')} gnorm {_fmt(row.get('actor_grad_norm', nan), '.2f')} "
            f"{row['step_s']:.1f}s/step (rollout {row['rollout_s']:.1f}s: {split_text(row)})"
            + (f" | {eval_text}" if eval_text else ""))


def _async_part(row: dict) -> str:
    """Fully async rows: group books, tokens by version lag, staleness violations (docs/async.md)."""
    if "groups_trained" not in row:
        return ""
    lags = " ".join(f"{k}:{v}" for k, v in row.get("version_lag_tokens", {}).items())
    alarm = " ALARM" if row.get("staleness_alarm") else ""
    return (f" | groups {row['groups_trained']} trained, {row['groups_dropped_zero_variance']} zero-var, "
            f"{row['groups_in_flight']} in flight | lag tokens {lags or '-'} | violations "
            f"{row['staleness_violations']}{alarm}")
