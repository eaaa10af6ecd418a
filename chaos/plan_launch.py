"""A stand-in cluster launcher for the plan-failure scenarios (dp1-incompatible, max-tokens-per-gpu).

It does what a scheduler front-end does with a plan file: validate the schema,
write the launch record the cluster would run. ``guarded=True`` puts
``t1ops preflight`` in front of it, which is the guardrail under test.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from t1ops.errors import PreflightRefusal
from t1ops.preflight import load_plan, require_ok


def launch(plan_path: Path, run_dir: Path, guarded: bool) -> Path:
    """Optional preflight gate, then the launch record; returns the record's path."""
    if guarded:
        require_ok(plan_path)
    plan = load_plan(plan_path)  # the naive path only checks what the schema checks
    par = plan.parallelism
    run_dir.mkdir(parents=True, exist_ok=True)
    record = run_dir / "launch.json"
    record.write_text(json.dumps({"plan": str(plan_path), "train_gpus": par.train_gpus, "tp": par.tp,
                                  "pp": par.pp, "cp": par.cp, "ep": par.ep, "dp": par.derived_dp,
                                  "max_tokens_per_gpu": plan.batch.max_tokens_per_gpu}))
    return record


def guarded_launch(plan_path: Path, run_dir: Path) -> tuple[str, float | None, list[str]]:
    """Launch behind preflight: (refusal text, seconds to refuse, finding ids); ("", None, []) if accepted."""
    t0 = time.monotonic()
    try:
        launch(plan_path, run_dir, guarded=True)
    except PreflightRefusal as err:
        return str(err), time.monotonic() - t0, err.context["finding_ids"]
    return "", None, []
