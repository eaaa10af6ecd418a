"""The preflight report: verdict, findings, memory terms; JSON and a readable table."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from t1ops.errors import PreflightRefusal
from t1ops.preflight import calibration as cal
from t1ops.preflight.checks import Finding
from t1ops.preflight.memory import TERMS, MemoryEstimate


def _terms_gib(terms: dict[str, int]) -> dict[str, float]:
    return {k: round(terms[k] / cal.GIB, 2) for k in TERMS}


@dataclass
class Report:
    """What ``check_plan`` returns. ``verdict`` is "refuse" iff any finding is an error."""

    plan_name: str
    findings: list[Finding]
    memory: MemoryEstimate
    host_ram_gib: dict[str, float] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return "refuse" if any(f.severity == "error" for f in self.findings) else "ok"

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def raise_if_refused(self) -> None:
        """For a launcher: raise PreflightRefusal carrying every error's arithmetic."""
        if self.verdict == "refuse":
            lines = "\n".join(f"- [{f.id}] {f.message}" for f in self.errors)
            raise PreflightRefusal(f"preflight refused plan {self.plan_name}:\n{lines}",
                                   plan=self.plan_name, finding_ids=[f.id for f in self.errors])

    def to_dict(self) -> dict[str, Any]:
        b = self.memory.binding
        return {
            "plan": self.plan_name,
            "verdict": self.verdict,
            "findings": [f.to_dict() for f in self.findings],
            "memory": {
                "peak_gib": round(b.peak_bytes / cal.GIB, 2),
                "fits": self.memory.fits,
                "capacity_gib": round(self.memory.capacity_bytes / cal.GIB, 2),
                "binding_phase": b.phase,
                "binding_stage": b.stage,
                "binding_transient": b.binding_transient,
                "peak_rule": "sum of non-transient terms + max(logits_buffer, gdn_activation)",
                "in_use_at_failure_gib": round(self.memory.in_use_at_failure_bytes / cal.GIB, 2),
                "failing_request_mib": round(self.memory.failing_request_bytes / cal.MIB, 1),
                "terms_gib": _terms_gib(b.terms),
                "phases": [{"phase": s.phase, "stage": s.stage, "peak_gib": round(s.peak_bytes / cal.GIB, 2),
                            "terms_gib": _terms_gib(s.terms)} for s in self.memory.by_phase],
            },
            "host_ram_gib": {k: round(v, 1) for k, v in self.host_ram_gib.items()},
        }


def render(report: Report) -> None:
    """Print the terms of every phase and the findings as rich tables."""
    from rich.console import Console
    from rich.table import Table

    mem = report.memory
    t = Table(title=f"preflight {report.plan_name}: per-GPU GiB (worst pipeline stage of each phase)")
    t.add_column("term")
    for s in mem.by_phase:
        t.add_column(f"{s.phase} (stage {s.stage})", justify="right")
    for term in TERMS:
        t.add_row(term + (" *" if term in ("logits_buffer", "gdn_activation") else ""),
                  *(f"{s.terms[term] / cal.GIB:.2f}" for s in mem.by_phase))
    cap = mem.capacity_bytes
    t.add_row("[bold]peak[/]", *(f"[{'red' if s.peak_bytes > cap else 'green'}]{s.peak_bytes / cal.GIB:.2f}[/]"
                                  for s in mem.by_phase))
    t.caption = f"* transients, never live together: peak counts the larger. GPU: {cap / cal.GIB:g} GiB"
    f = Table(title=f"verdict: {report.verdict}")
    for col in ("id", "severity", "message"):
        f.add_column(col, overflow="fold")
    colour = {"error": "red", "warning": "yellow", "info": "cyan"}
    for x in report.findings:
        f.add_row(x.id, f"[{colour[x.severity]}]{x.severity}[/]", x.message)
    console = Console()
    console.print(t)
    console.print(f)
