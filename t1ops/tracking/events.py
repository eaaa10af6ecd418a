"""Guard events for the trackers: the warn/error records every process of a run appended to
``telemetry/**/events.jsonl`` (``t1ops.telemetry.event``), read incrementally.

Each call to :meth:`EventTail.take` returns what was appended since the previous call, so the
tracker shows an event at the step during which it fired (launch-time events at the first step).
The read offsets are part of the tracker's state (``tracking.json``): a resumed run reports the
events the crashed run wrote after its last tracked step at its first resumed step, never twice.
"""
from __future__ import annotations

import json
from pathlib import Path

SEVERITIES = ("warn", "error")


class EventTail:
    def __init__(self, run_dir: Path, offsets: dict[str, int] | None = None) -> None:
        self.root = Path(run_dir) / "telemetry"
        self.offsets: dict[str, int] = dict(offsets or {})

    def take(self) -> list[dict]:
        """New warn/error events of every role, oldest first; each carries its ``role`` (the
        telemetry subdirectory, empty for the coordinator)."""
        found: list[dict] = []
        for path in sorted(self.root.rglob("events.jsonl")) if self.root.is_dir() else []:
            rel = str(path.relative_to(self.root))
            with open(path, "rb") as f:
                f.seek(self.offsets.get(rel, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written is read next time
            self.offsets[rel] = self.offsets.get(rel, 0) + end
            parent = path.parent.relative_to(self.root)
            role = "" if parent == Path(".") else str(parent)
            for line in data[:end].splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a torn line of a killed process: the JSON lines file keeps it as it is
                if rec.get("severity") in SEVERITIES:
                    found.append({**rec, "role": role})
        return sorted(found, key=lambda r: r.get("time", 0))
