"""Reading a CTRF report (``pytest --ctrf``) written by a verifier run: outside data.

Only the fields the reward needs are trusted, and each is checked: a
malformed report is a ParseError naming the field, which the verifier turns
into the binary fallback (report section 06: "parse failures are tagged by
source for observability").
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl.agent.bounded import check_nesting, read_regular, short
from rl.errors import ParseError

MAX_CTRF_BYTES = 8 * 1024 * 1024   # a real report for a few dozen tests is a few KiB


def parse_ctrf(raw: bytes | str, *, source: str = "ctrf.json") -> dict[str, Any]:
    """Parse CTRF JSON and validate ``results.summary`` (non-negative int counts, passed <= tests,
    start <= stop when present) and ``results.tests`` (list of objects with a string status)."""
    if len(raw) > MAX_CTRF_BYTES:
        raise ParseError(f"{source}: {len(raw)} bytes exceeds {MAX_CTRF_BYTES}", source=source)
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    deep = check_nesting(text)
    if deep:
        raise ParseError(f"{source}: {deep}", source=source)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:   # ValueError: bad JSON or an int past the digit limit
        raise ParseError(f"{source}: not JSON ({type(e).__name__}: {e})"[:300], source=source) from e
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, dict):
        raise ParseError(f"{source}: missing object 'results'", source=source, field="results")
    summary = results.get("summary")
    if not isinstance(summary, dict):
        raise ParseError(f"{source}: missing object 'results.summary'", source=source,
                         field="results.summary")
    for key in ("tests", "passed", "failed"):
        v = summary.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ParseError(f"{source}: results.summary.{key} must be a non-negative int, got {v!r:.40}",
                             source=source, field=f"results.summary.{key}")
    if summary["passed"] + summary["failed"] > summary["tests"]:
        raise ParseError(f"{source}: passed {summary['passed']} + failed {summary['failed']} > tests "
                         f"{summary['tests']}", source=source, field="results.summary")
    for key in ("start", "stop"):
        v = summary.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise ParseError(f"{source}: results.summary.{key} must be a number (ms)", source=source,
                             field=f"results.summary.{key}")
    tests = results.get("tests", [])
    if not isinstance(tests, list) or not all(isinstance(t, dict) and isinstance(t.get("status"), str)
                                              for t in tests):
        raise ParseError(f"{source}: results.tests must be a list of objects with a string status",
                         source=source, field="results.tests")
    return doc


def read_ctrf(path: str | Path) -> dict[str, Any]:
    """Read and validate a CTRF file (a missing file is a ParseError too)."""
    p = Path(path)
    try:
        data, _ = read_regular(p, MAX_CTRF_BYTES)   # never blocks on a FIFO, never follows a link
    except OSError as e:
        raise ParseError(f"{p}: cannot read ({short(e, 200)})", source=str(p)) from e
    return parse_ctrf(data, source=str(p))
