"""One tracker facade over TensorBoard and W&B, fed by the summary's row writer (docs/tracking.md).

``t1ops.campaign.summary.Summary`` calls :meth:`Tracker.step` after each step row and
:meth:`Tracker.eval` after each evaluation is in summary.json, so every pipeline mode (sync,
one_step, fully_async) is tracked by the same code. summary.json and telemetry/*.jsonl are the
source of truth: a sink that raises is turned off with one warning (:class:`TrackerWarning`, and a
``tracking.disabled`` event) and the campaign goes on.
"""
from __future__ import annotations

import contextlib
import json
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

from t1ops import telemetry
from t1ops.tracking.events import EventTail
from t1ops.tracking.scalars import events_markdown, flat_config, scalars

STATE_FILE = "tracking.json"
GUARD_TAG = "guards/events"
REPORT_TAG = "report"
HPARAM_METRICS = ["reward/reward_mean", "reward/eval_reward_mean"]


class TrackerWarning(UserWarning):
    """A tracker failed and was turned off; the run's JSON lines and summary.json are unaffected."""


class Tracker:
    def __init__(self, run_dir: Path, state: dict | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.state: dict[str, Any] = dict(state or {})
        self.sinks: list = []
        self.events = EventTail(self.run_dir, self.state.get("event_offsets"))
        self._lock = threading.Lock()  # evaluations may be recorded from another thread than steps

    @classmethod
    def open(cls, tracking, run_dir: Path, run_id: str, config: dict, resume_step: int | None) -> "Tracker":
        """The sinks ``tracking`` (a ``TrackingConfig``) asks for; ``resume_step``: the verified step a
        resumed run continues from (None: a new run)."""
        path = Path(run_dir) / STATE_FILE
        try:
            state = json.loads(path.read_text()) if resume_step is not None and path.is_file() else {}
        except (OSError, ValueError) as err:  # a torn state file: a new W&B run, events from the start
            warnings.warn(f"tracking: {path} is unreadable ({err}); trackers start a new run", TrackerWarning)
            state = {}
        t = cls(run_dir, state)
        if tracking.tensorboard:
            from t1ops.tracking.tensorboard import TensorBoardSink

            t.add("tensorboard", lambda: TensorBoardSink(t.run_dir, None if resume_step is None else resume_step + 1))
        if tracking.wandb != "off":
            from t1ops.tracking.wandb_sink import WandbSink, new_run_id

            def make():
                t.state.setdefault("wandb_run_id", new_run_id())
                return WandbSink(tracking.wandb, t.run_dir, t.state["wandb_run_id"], project=tracking.project,
                                 entity=tracking.entity, name=tracking.run_name or run_id, tags=tracking.tags,
                                 config=config)
            t.add("wandb", make)
        with t._guard():
            if resume_step is None:
                t._each(lambda s: s.hparams(config, flat_config(config), HPARAM_METRICS))
            t._save_state()
        return t

    def add(self, name: str, make: Callable[[], Any]) -> None:
        """Open one sink; one that cannot open is off (one warning), as one that fails later."""
        try:
            self.sinks.append(make())
        except Exception as err:
            self._disable(name, err)

    def step(self, row: dict) -> None:
        """One step row: its scalars and the guard events since the previous row, at ``row["step"]``."""
        with self._lock, self._guard():
            step = int(row["step"])
            values = scalars(row)
            events = self.events.take()
            if events:
                values["guards/warn_events"] = float(sum(e["severity"] == "warn" for e in events))
                values["guards/error_events"] = float(sum(e["severity"] == "error" for e in events))
            self._each(lambda s: s.scalars(step, values))
            if events:
                text = events_markdown(events)
                self._each(lambda s: s.text(step, GUARD_TAG, text))
            self._each(lambda s: s.flush())
            self._save_state()

    def eval(self, row: dict) -> None:
        """One held-out evaluation, at the step whose weights it evaluated."""
        with self._lock, self._guard():
            step = int(row["step"])
            values = scalars(row, keys="eval")
            self._each(lambda s: s.scalars(step, values))
            self._each(lambda s: s.flush())

    def report(self, path: Path, step: int) -> None:
        """The run's report.png at ``step``: refreshed during the run (every few steps and at each
        evaluation, ``t1ops.campaign.summary.REPORT_EVERY``) and at its last step."""
        with self._lock, self._guard():
            self._each(lambda s: s.image(step, REPORT_TAG, Path(path)))

    def close(self) -> None:
        with self._lock:
            self._each(lambda s: s.close())
            self.sinks.clear()

    @contextlib.contextmanager
    def _guard(self):
        """A failure outside any one sink (reading the events, writing tracking.json): every tracker
        off, one warning; the campaign goes on."""
        try:
            yield
        except Exception as err:
            for sink in self.sinks:
                try:
                    sink.close()
                except Exception:
                    pass
            if self.sinks:
                self.sinks.clear()
                self._disable("all trackers", err)

    def _each(self, call: Callable[[Any], None]) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as err:  # a tracker never stops a campaign: off, with one warning
                self.sinks.remove(sink)
                self._disable(sink.name, err)
                try:  # release its files and threads if it still can; its failure is already reported
                    sink.close()
                except Exception:
                    pass

    def _disable(self, name: str, err: Exception) -> None:
        message = (f"tracking: {name} failed ({type(err).__name__}: {err}) and is off for the rest of this run; "
                   "summary.json and telemetry/*.jsonl are complete (fix [tracking] or set it off)")
        warnings.warn(message, TrackerWarning, stacklevel=3)
        telemetry.event("tracking.disabled", severity="warn", tracker=name, error=f"{type(err).__name__}: {err}")

    def _save_state(self) -> None:
        self.state["event_offsets"] = self.events.offsets
        tmp = self.run_dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.run_dir / STATE_FILE)
