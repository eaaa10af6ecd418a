"""Render chaos results: a terminal table (rich) and Markdown for CI artifacts."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from chaos.harness import ScenarioResult


def _short(text: str, n: int = 70) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _det(r: ScenarioResult) -> str:
    return "-" if r.guarded.detection_s is None else f"{r.guarded.detection_s:.2f} s"


def print_list(rows: list[dict]) -> None:
    t = Table(title="chaos scenarios")
    for col in ("id", "title", "runbook"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["id"], r["title"], r["runbook"])
    Console(width=160).print(t)


def print_table(results: list[ScenarioResult]) -> None:
    t = Table(title="chaos report")
    for col in ("id", "fault fired", "unguarded symptom", "guarded outcome", "detection", "result"):
        t.add_column(col, overflow="fold")
    for r in results:
        outcome = ("crashed: " + r.crashed.strip().splitlines()[-1]) if r.crashed else _short(r.guarded.error)
        t.add_row(r.id, "yes" if r.fault_fired else "NO", _short(r.unguarded), outcome, _det(r),
                  "[green]pass[/]" if r.passed else "[red]FAIL[/]")
    Console(width=160).print(t)
    n_pass = sum(r.passed for r in results)
    Console(width=160).print(f"{n_pass}/{len(results)} scenarios passed")


def markdown(results: list[ScenarioResult]) -> str:
    lines = ["# Chaos report", "", "| id | fault fired | unguarded symptom | guarded outcome | detection | result |",
             "|---|---|---|---|---|---|"]
    for r in results:
        cells = [f"[{r.id}](../{r.runbook})", "yes" if r.fault_fired else "NO",
                 _short(r.unguarded, 120), _short(r.guarded.error or "(crashed)", 120), _det(r),
                 "pass" if r.passed else "FAIL"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    n_pass = sum(r.passed for r in results)
    lines += ["", f"{n_pass}/{len(results)} scenarios passed", ""]
    return "\n".join(lines)
