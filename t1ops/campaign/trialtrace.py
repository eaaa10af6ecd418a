"""Where a trial's seconds go: per-trial phase clocks and spans, per-step split.

A trial's wall time is split into phases (docs/tracing.md):

- ``queue_s``: waiting for a concurrency slot (``rollout.max_concurrency``) and the sandbox token bucket;
- ``sandbox_s``: creating the trial directory, running the agent's commands, sweeping;
- ``generate_s``: ``/generate`` calls (engine queueing and decoding, HTTP, routing decode);
- ``verify_s``: the verifier (tamper scan, test run, CTRF, reward).

Each phase is also an OpenTelemetry span under the trial's ``trial`` span,
itself under the worker's ``rollout`` span that continues the coordinator's
``rollout.submit`` span of the step. :func:`step_split` turns a step's trial
rows into the summary fields: the summed seconds, and each as a share of the
step's trial-seconds (trials overlap, so shares of the sum, not of ``rollout_s``).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from t1ops import telemetry

PHASES = ("queue_s", "sandbox_s", "generate_s", "verify_s")


@dataclass
class TrialClock:
    """Seconds per phase of one trial; ``phase()`` times a block and traces it as a span."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    started: float = field(default_factory=time.monotonic)

    @contextmanager
    def phase(self, key: str, name: str, **attrs) -> Iterator[object]:
        t0 = time.monotonic()
        with telemetry.span(name, **attrs) as sp:
            try:
                yield sp
            finally:
                self.seconds[key] += time.monotonic() - t0

    def add(self, key: str, seconds: float) -> None:
        self.seconds[key] += seconds

    def row(self) -> dict:
        """The trial's phase seconds plus ``trial_s`` (wall time including the queue)."""
        out = {k: round(v, 4) for k, v in self.seconds.items()}
        out["trial_s"] = round(self.seconds["queue_s"] + time.monotonic() - self.started, 4)
        return out


def step_split(results: list, rollout_s: float) -> dict:
    """Summary fields of one step (docs/tracing.md).

    ``<phase>`` is summed over the step's trials. Trials overlap, so shares are of
    trial-seconds, not of ``rollout_s``: ``generate_share``, ``sandbox_share``,
    ``verify_share`` and ``other_share`` (tokenising, rendering, gaps) split the
    *active* trial-seconds (after leaving the queue) and add up to 1;
    ``queue_share`` is the part of all trial-seconds spent waiting for a slot.
    ``concurrency`` = active trial-seconds / ``rollout_s`` (trials running at once, on average).
    """
    row = {k: round(sum(getattr(r, k) for r in results), 3) for k in PHASES}  # TrialResult's phase seconds
    total = sum(r.trial_s for r in results)
    active = total - row["queue_s"]
    row["trial_s"] = round(total, 3)
    row["concurrency"] = round(active / rollout_s, 2) if rollout_s > 0 else 0.0
    for k in ("generate_s", "sandbox_s", "verify_s"):
        row[k.removesuffix("_s") + "_share"] = round(row[k] / active, 4) if active > 0 else 0.0
    row["other_share"] = round(max(0.0, 1.0 - row["generate_share"] - row["sandbox_share"] - row["verify_share"]), 4)
    row["queue_share"] = round(row["queue_s"] / total, 4) if total > 0 else 0.0
    return row


def split_text(row: dict) -> str:
    """``gen 53% sbx 4% ver 43% (queued 64%, x7.9)`` for the step line (empty without a split)."""
    if "generate_share" not in row:
        return ""
    shares = " ".join(f"{label} {100 * row[key]:.0f}%" for label, key in
                      (("gen", "generate_share"), ("sbx", "sandbox_share"), ("ver", "verify_share")))
    return f"{shares} (queued {100 * row['queue_share']:.0f}%, x{row['concurrency']:.1f} concurrent)"


def read_trial_spans(run_dir) -> dict[str, dict]:
    """Spans of a run's trials by ``trial_id``: ``{"step", "trace_id", "names": [...], "submit_trace_ids"}``.

    Reads every ``telemetry/**/spans.jsonl`` of the run directory (the OTel console format);
    ``names`` lists the span names under the trial (its phases, turns and generate calls).
    """
    import json
    from pathlib import Path

    spans = []
    for path in Path(run_dir, "telemetry").rglob("spans.jsonl"):
        spans += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_id = {s["context"]["span_id"]: s for s in spans}
    children: dict[str, list[dict]] = {}
    for s in spans:
        children.setdefault(s.get("parent_id"), []).append(s)

    def below(span_id: str) -> list[str]:
        return [n for c in children.get(span_id, []) for n in (c["name"], *below(c["context"]["span_id"]))]

    out = {}
    for s in spans:
        if s["name"] == "trial" and "trial_id" in s["attributes"]:
            root = s
            while root.get("parent_id") in by_id:
                root = by_id[root["parent_id"]]
            out[s["attributes"]["trial_id"]] = {
                "step": s["attributes"].get("step"), "trace_id": s["context"]["trace_id"],
                "root": root["name"], "root_step": root["attributes"].get("step"),
                "names": below(s["context"]["span_id"])}
    return out
