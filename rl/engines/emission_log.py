"""The engine side's own record of what it emitted: one JSON line per finished request.

The audit's loss-region drift (T1 report, section 05: "0.0000% drift inside the loss
region") must compare the trained ids with something the trajectory pipeline did not
produce. The embedded engine (``--emission-log PATH``) and the OpenAI endpoint (its
session, ``HarnessSession.emission_log``) each append, per request, the ids they emitted:

``{"rid": "<request id>", "output_ids": [...], "weight_version": "3", "finish": "stop", "by": "engine"}``

in tokenizer ids, written by the process that sampled (or relayed) them, before the
response leaves it. ``t1ops audit`` reads every ``*.jsonl`` of the run's ``emissions/``
directory (``t1ops.audit_engine``). Appends are one ``write`` of one line under a lock,
so concurrent requests never interleave inside a line.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path


class EmissionLog:
    """Append-only JSON-lines record of emitted ids (thread-safe within one process)."""

    def __init__(self, path: str | Path, by: str = "engine") -> None:
        self.path, self.by = Path(path), by
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def record(self, rid: str | None, output_ids, weight_version: str | None = None,
               finish: str | None = None) -> None:
        line = json.dumps({"rid": rid, "output_ids": [int(t) for t in output_ids], "weight_version": weight_version,
                           "finish": finish, "by": self.by}) + "\n"
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)


def read_emissions(directory: str | Path) -> dict[str, dict[str, list[int]]]:
    """``{rid: {by: output_ids}}`` from every ``*.jsonl`` in ``directory``. A request answered twice
    (an abort, then a resubmission) keeps its last non-aborted answer per recorder; a torn last
    line (a process killed mid-write) is skipped."""
    out: dict[str, dict[str, list[int]]] = {}
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(rec, dict) or rec.get("rid") is None or rec.get("finish") == "abort":
                continue
            out.setdefault(str(rec["rid"]), {})[str(rec.get("by", "engine"))] = list(rec.get("output_ids") or [])
    return out
