"""OpenTelemetry, set up once per process.

Metrics and spans go to JSON lines in the run directory
(``telemetry/metrics.jsonl``, ``telemetry/spans.jsonl``) through the SDK's own
console exporters pointed at files, and optionally to an OTLP endpoint. Every
guardrail reports through :func:`count`, :func:`gauge`, :func:`observe` and
:func:`event`, so a guard's events are visible in one place. Events are also
kept in a bounded in-memory ring (``recent_events``) for the progress display,
the chaos harness and tests.
"""
from __future__ import annotations

import collections
import json
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

_METER_NAME = "t1ops"
_lock = threading.Lock()
_state: dict[str, Any] = {"meter_provider": None, "tracer_provider": None, "files": [], "events_file": None}
_instruments: dict[tuple[str, str], Any] = {}
_events: collections.deque = collections.deque(maxlen=4096)


class _RunFile:
    """A JSON-lines file that ignores writes once closed: an exporter thread the SDK could not stop
    within its shutdown timeout (a loaded host) must not write into a closed file of a past run."""

    def __init__(self, path: Path) -> None:
        self._f: TextIO | None = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            return self._f.write(text) if self._f is not None else 0

    def flush(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.flush()

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


def setup(run_dir: str | Path, *, service: str = "t1ops", role: str | None = None,
          otlp_endpoint: str | None = None, export_interval_s: float = 5.0) -> Path:
    """Install meter and tracer providers writing JSON lines under ``run_dir/telemetry``.

    ``role`` names another process of the same run (``router``, ``worker-0``,
    ``trainer``): its files go to ``run_dir/telemetry/<role>/``, so every
    process of a campaign reports into one tree. Safe to call once per
    process at a time; a second call is a no-op that returns the existing directory, and
    after :func:`shutdown` a new call starts fresh files (two runs in one process are safe).
    """
    with _lock:
        if _state["meter_provider"] is not None:
            return Path(_state["dir"])
        out = Path(run_dir) / "telemetry" / (role or "")
        out.mkdir(parents=True, exist_ok=True)
        mfile, sfile, efile = (_RunFile(out / f"{n}.jsonl") for n in ("metrics", "spans", "events"))
        resource = Resource.create({"service.name": service, "t1ops.role": role or "coordinator"})
        readers = [PeriodicExportingMetricReader(
            ConsoleMetricExporter(out=mfile, formatter=lambda d: d.to_json(indent=None) + "\n"),
            export_interval_millis=export_interval_s * 1000)]
        tp = TracerProvider(resource=resource)
        tp.add_span_processor(SimpleSpanProcessor(
            ConsoleSpanExporter(out=sfile, formatter=lambda s: s.to_json(indent=None) + "\n")))
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{otlp_endpoint}/v1/metrics")))
            tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_endpoint}/v1/traces")))
        mp = MeterProvider(resource=resource, metric_readers=readers)
        # The providers are ours, never installed as OpenTelemetry's process globals: those can be
        # set once per process, so a second campaign in one process (a benchmark, the chaos soak)
        # would keep writing through the first run's closed files.
        _state.update(meter_provider=mp, tracer_provider=tp, files=[mfile, sfile, efile],
                      events_file=efile, dir=str(out))
        _instruments.clear()
        return out


def shutdown() -> None:
    """Flush and close exporters (call at the end of a run)."""
    with _lock:
        mp, tp = _state["meter_provider"], _state["tracer_provider"]
        if mp is not None:
            mp.force_flush()
            mp.shutdown()
        if tp is not None:
            tp.force_flush()
            tp.shutdown()
        for f in _state["files"]:
            f.close()
        _state.update(meter_provider=None, tracer_provider=None, files=[], events_file=None)
        _instruments.clear()  # instruments of a shut-down provider record nowhere


def _meter():
    mp = _state["meter_provider"]
    return mp.get_meter(_METER_NAME) if mp is not None else metrics.get_meter(_METER_NAME)


def _tracer():
    tp = _state["tracer_provider"]
    return tp.get_tracer(_METER_NAME) if tp is not None else trace.get_tracer(_METER_NAME)


def _instrument(kind: str, name: str):
    key = (kind, name)
    inst = _instruments.get(key)
    if inst is None:
        m = _meter()
        inst = {"counter": m.create_counter, "gauge": m.create_gauge,
                "histogram": m.create_histogram}[kind](name)
        _instruments[key] = inst
    return inst


def count(name: str, amount: float = 1, **attrs: Any) -> None:
    """Add to a monotonic counter, e.g. ``count("engine.recreated", engine=2)``."""
    _instrument("counter", name).add(amount, attributes=_clean(attrs))


def gauge(name: str, value: float, **attrs: Any) -> None:
    """Set a gauge, e.g. ``gauge("fd.open", 812, pid=123)``."""
    _instrument("gauge", name).set(value, attributes=_clean(attrs))


def observe(name: str, value: float, **attrs: Any) -> None:
    """Record one value in a histogram, e.g. a detection latency."""
    _instrument("histogram", name).record(value, attributes=_clean(attrs))


def event(name: str, severity: str = "info", **attrs: Any) -> dict:
    """A named guardrail event: counted, kept in memory, written to events.jsonl,
    and attached to the current span if one is recording."""
    rec = {"time": time.time(), "name": name, "severity": severity, **_clean(attrs)}
    _events.append(rec)
    count(f"event.{name}", severity=severity)
    f = _state["events_file"]
    if f is not None:
        f.write(json.dumps(rec, default=str) + "\n")
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, attributes=_clean(attrs))
    return rec


def forget_recent_events() -> None:
    """Empty this process's event ring (the test suite does it before each test, so a test only
    ever sees the events it caused)."""
    _events.clear()


def recent_events(name: str | None = None, since: float | None = None) -> list[dict]:
    """Events recorded in this process (newest last), optionally by name and from wall time
    ``since`` (``time.time()``). The ring is bounded and shared by everything the process ran:
    select what is new by time, never by counting (a full ring drops old events as new ones come)."""
    return [e for e in list(_events) if (name is None or e["name"] == name) and (since is None or e["time"] >= since)]


def span(name: str, *, parent: dict | None = None, **attrs: Any):
    """A tracing span context manager: ``with span("step", step=3): ...``.

    ``parent`` is a carrier from :func:`trace_carrier` in another process (a
    Ray call's argument): the span continues that trace (see docs/tracing.md).
    """
    context = None
    if parent:
        from opentelemetry.propagate import extract

        context = extract(parent)
    return _tracer().start_as_current_span(name, context=context, attributes=_clean(attrs))


def trace_carrier() -> dict:
    """The current span's W3C trace context as a dict to pass to another process."""
    from opentelemetry.propagate import inject

    carrier: dict = {}
    inject(carrier)
    return carrier


def tracer():
    """This process's OpenTelemetry tracer (a no-op tracer before :func:`setup`), for code in
    ``rl`` that takes a tracer argument (``rl.agent.loop.run_episode``)."""
    return _tracer()


def _clean(attrs: dict) -> dict:
    """OTel attributes must be str/bool/int/float; stringify the rest."""
    return {k: v if isinstance(v, (str, bool, int, float)) else str(v) for k, v in attrs.items() if v is not None}
