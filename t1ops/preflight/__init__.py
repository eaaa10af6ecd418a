"""Preflight: a calibrated per-GPU memory model and parallelism checks for a plan.

``check_plan(plan) -> Report`` is what a launcher calls before spending
GPU-days; ``report.raise_if_refused()`` turns a refusal into
:class:`~t1ops.errors.PreflightRefusal`. ``t1ops preflight PLAN`` is the CLI.
"""
from __future__ import annotations

from pathlib import Path

from t1ops import telemetry
from t1ops.preflight.checks import ALL_CHECKS, Finding, effective_ep
from t1ops.preflight.host import host_ram_terms_gib
from t1ops.preflight.memory import MemoryEstimate, estimate
from t1ops.preflight.plan import Plan, load_plan
from t1ops.preflight.report import Report, render

__all__ = ["Finding", "MemoryEstimate", "Plan", "Report", "check_plan", "estimate", "load_plan", "render",
           "require_ok"]


def _expert_layout(plan: Plan) -> tuple[int, list[Finding]]:
    """The EP the layout can really host, and an error if it is not the requested one."""
    par, ep = plan.parallelism, effective_ep(plan)
    if ep == par.ep:
        return ep, []
    if par.derived_dp == 1:  # check_dp1 explains this case with the report's arithmetic
        return ep, []
    return ep, [Finding("expert-layout", "error",
                        f"ep = {par.ep} needs train_gpus divisible by pp*ep*etp = {par.pp * par.ep * par.etp}; "
                        f"{par.train_gpus} is not. This layout can host ep = {ep} at most")]


def check_plan(plan: Plan, name: str = "plan") -> Report:
    """Run the memory model and every check on ``plan``; never raises on a bad plan, refuses instead."""
    with telemetry.span("preflight.check_plan", plan=name):
        ep, findings = _expert_layout(plan)
        est = estimate(plan, ep=ep)
        for check in ALL_CHECKS:
            findings.extend(check(plan, est))
        order = {"error": 0, "warning": 1, "info": 2}
        findings.sort(key=lambda f: order[f.severity])
        report = Report(name, findings, est, host_ram_terms_gib(plan))
    telemetry.gauge("preflight.peak_gib", est.binding.peak_bytes / 2**30, plan=name)
    if report.verdict == "refuse":
        telemetry.event("preflight.refused", severity="error", plan=name,
                        finding_ids=",".join(f.id for f in report.errors))
    return report


def require_ok(plan_or_path: Plan | str | Path) -> Report:
    """Launch gate: load (if a path), check, and raise PreflightRefusal unless the verdict is ok."""
    if isinstance(plan_or_path, Plan):
        report = check_plan(plan_or_path)
    else:
        report = check_plan(load_plan(plan_or_path), name=Path(plan_or_path).stem)
    report.raise_if_refused()
    return report
