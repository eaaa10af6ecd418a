"""Render chaos results: a terminal table (rich) and Markdown for CI artifacts.

Columns (issue 10): id, fault fired, unguarded symptom, guarded outcome,
detection time, result. A failed row says why (crash, fault not fired,
guardrail missed, which invariant broke); the Markdown adds a section per
failure with the full text, so a CI artifact is enough to start debugging.
"""
from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chaos.harness import ScenarioResult

CONSOLE_WIDTH = 160


def _short(text: str, n: int = 70) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def format_seconds(seconds: float | None) -> str:
    """``-`` for None; milliseconds below 0.1 s (a guard that acts in-step reads 0.3 ms, not 0.00 s)."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds:.2f} s"


def _crash_line(traceback_text: str) -> str:
    """``EngineDeadError: msg`` from a traceback's last line (module path dropped)."""
    name, sep, message = traceback_text.strip().splitlines()[-1].partition(": ")
    return name.rsplit(".", 1)[-1] + sep + message


def failure_reason(r: ScenarioResult) -> str:
    """Why a result failed ("" when it passed), first cause first."""
    if r.crashed:
        return "crashed: " + _crash_line(r.crashed)
    if not r.fault_fired:
        return "the fault did not fire"
    if not r.guarded.caught:
        return "the guardrail missed it"
    if not r.unguarded_asserted:
        return "the unguarded failure is not asserted (no invariant named unguarded*)"
    broken = [name for name, ok in r.invariants.items() if not ok]
    return ("invariant broken: " + ", ".join(broken)) if broken else ""


def guarded_outcome(r: ScenarioResult) -> str:
    """What the user sees with the guardrail on (or why there is nothing to see)."""
    if r.crashed:
        return "(crashed before an outcome)"
    text = r.guarded.error or "(no message)"
    return text if r.guarded.caught else f"MISSED: {text}"


DURATIONS = Path(__file__).resolve().parent / "durations.json"


def typical_durations() -> dict[str, float]:
    """Wall seconds of each scenario's one run, measured (``chaos/durations.json``: scenario id ->
    seconds, with the host and commit it was measured on); {} when the file is absent."""
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {k: float(v) for k, v in data.get("seconds", {}).items()}


def _measured() -> dict:
    try:
        return json.loads(DURATIONS.read_text()).get("measured", {})
    except (OSError, json.JSONDecodeError):
        return {}


def _measured_cpus() -> str:
    return "/".join(str(c) for c in sorted({m.get("cpus") for m in _measured().values()} - {None}))


def record_durations(results: list[ScenarioResult], path: Path = DURATIONS) -> None:
    """Merge the wall seconds of passed runs into ``path``; each entry says where it was measured."""
    import os
    import time

    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        data = {}
    data["about"] = ("wall seconds of one `t1ops chaos run ID`, written by `t1ops chaos run ID... "
                     "--record-durations`; `measured` says on what host and under what load")
    where = {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 1), "at": time.strftime("%Y-%m-%d")}
    for r in results:
        if r.passed:
            data.setdefault("seconds", {})[r.id] = round(r.duration_s, 1)
            data.setdefault("measured", {})[r.id] = where
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def print_list(rows: list[dict]) -> None:
    t = Table(title="chaos scenarios (typical: wall seconds of one `t1ops chaos run ID` as measured in "
                    "chaos/durations.json; '-': not measured yet)")
    for col in ("id", "title", "typical", "runbook"):
        t.add_column(col, justify="right" if col == "typical" else "left", no_wrap=col in ("id", "typical"))
    for r in rows:
        typical = r.get("typical_s")
        shown = "-" if typical is None else "<1 s" if typical < 1 else f"{typical:.0f} s"
        t.add_row(r["id"], escape(r["title"]), shown, r["runbook"])
    Console(width=CONSOLE_WIDTH).print(t)
    known = [r["typical_s"] for r in rows if r.get("typical_s") is not None]
    if known:
        loads = sorted({m.get("load_1min") for m in _measured().values()} - {None})
        Console(width=CONSOLE_WIDTH).print(
            f"{len(known)} of {len(rows)} measured, about {sum(known) / 60:.0f} min together"
            + (f", on {_measured_cpus()} CPUs at load {'-'.join(dict.fromkeys(f'{x:g}' for x in (loads[0], loads[-1])))} "
               "(an idle host is faster)" if loads else "")
            + "; re-measure: t1ops chaos run --all --record-durations")


def print_table(results: list[ScenarioResult]) -> None:
    t = Table(title="chaos report")
    t.add_column("id", no_wrap=True)
    t.add_column("fired", no_wrap=True)
    t.add_column("unguarded symptom", ratio=1)
    t.add_column("guarded outcome", ratio=1)
    t.add_column("detection", no_wrap=True, justify="right")
    t.add_column("run", no_wrap=True, justify="right")
    t.add_column("result", max_width=20)
    for r in results:
        verdict = "[green]pass[/]" if r.passed else f"[red]FAIL[/] {escape(_short(failure_reason(r), 34))}"
        t.add_row(r.id, "yes" if r.fault_fired else "[red]NO[/]", escape(_short(r.unguarded, 400)),
                  escape(_short(guarded_outcome(r), 400)), format_seconds(r.guarded.detection_s),  # wrapped, not cut
                  format_seconds(r.duration_s), verdict)
    console = Console(width=CONSOLE_WIDTH)
    console.print(t)
    console.print(summary_line(results))
    console.print("\n".join(recovery_lines(results)))


def recovery_cells(r: ScenarioResult) -> list[str]:
    """time to detect, time to recover (``stop X``: the run stopped with the named error X after the
    fault, by design), steps lost, trials lost, how; a scenario that marked no timeline says so."""
    rec = r.recovery
    if rec is None or not rec.measured and rec.how.startswith("NOT MEASURED"):
        return [format_seconds(rec.detect_s if rec else None), "-", "-", "-", rec.how if rec else "NOT MEASURED"]
    recover = (format_seconds(rec.recover_s) if rec.recover_s is not None
               else f"stop {format_seconds(rec.stopped_s)}" if rec.stopped_s is not None else "-")
    return [format_seconds(rec.detect_s), recover, str(rec.steps_lost), str(rec.trials_lost), rec.how or "-"]


def recovery_lines(results: list[ScenarioResult]) -> list[str]:
    """The time-to-recover table (plain text): per fault, from the fault to the guard's detection and
    to the first healthy step (or the resume), and the steps and trials the fault cost."""
    lines = ["time to recover (from the fault)",
             f"{'id':30} {'detect':>10} {'recover':>10} {'steps lost':>10} {'trials lost':>11}  how"]
    for r in results:
        det, rec, steps, trials, how = recovery_cells(r)
        lines.append(f"{r.id:30} {det:>10} {rec:>10} {steps:>10} {trials:>11}  {how}")
    return lines


def summary_line(results: list[ScenarioResult]) -> str:
    n_pass = sum(r.passed for r in results)
    failed = [r.id for r in results if not r.passed]
    total_s = sum(r.duration_s for r in results)
    line = f"{n_pass}/{len(results)} scenarios passed in {total_s:.1f} s"
    return line + (f"; failed: {', '.join(failed)}" if failed else "")


def _cell(text: str) -> str:
    """Markdown table cell: pipes escaped, angle brackets kept visible, one line."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def markdown(results: list[ScenarioResult], runbook_prefix: str = "") -> str:
    """The report as Markdown: a table, a summary line, then one section per failure.

    ``runbook_prefix`` is prepended to each ``runbooks/<id>.md`` link (e.g.
    ``../`` when the file is written one level below the repository root).
    """
    lines = ["# Chaos report", "",
             "| id | fault fired | unguarded symptom | guarded outcome | detection | run | result |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        cells = [_cell(_short(r.unguarded, 160)), _cell(_short(guarded_outcome(r), 160)),
                 format_seconds(r.guarded.detection_s), format_seconds(r.duration_s),
                 "pass" if r.passed else f"**FAIL**: {_cell(_short(failure_reason(r), 80))}"]
        lines.append(f"| [{r.id}]({runbook_prefix}{r.runbook}) | {'yes' if r.fault_fired else '**NO**'} | "
                     + " | ".join(cells) + " |")
    lines += ["", summary_line(results), "", "## Time to recover", "",
              "| id | time to detect | time to recover | steps lost | trials lost | how |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.id} | " + " | ".join(_cell(c) for c in recovery_cells(r)) + " |" for r in results]
    lines.append("")
    for r in (r for r in results if not r.passed):
        lines += [f"## {r.id}: {_short(failure_reason(r), 100)}", ""]
        if r.crashed:  # the traceback says it all; the outcome fields are empty
            lines += ["```", r.crashed.rstrip(), "```", ""]
            continue
        lines += [f"- unguarded: {r.unguarded or '(none recorded)'}", f"- guarded: {guarded_outcome(r)}",
                  f"- invariants: {', '.join(f'{k}={v}' for k, v in r.invariants.items()) or '(none)'}",
                  f"- details: `{json.dumps(r.details, default=str)}`", ""]
    return "\n".join(lines)
