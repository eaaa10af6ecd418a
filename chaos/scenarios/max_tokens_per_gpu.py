"""max-tokens-per-gpu: lowering the packer cap to "fix" an OOM caused by one long sample.

Fault (real): the bad plan file is written to disk: the 56-GPU plan that OOMs
on a 40k-token sample, with ``max_tokens_per_gpu`` lowered from 8192 to 4096
(T1 report, section 09: "Lowering the dynamic packer's cap from 8192 to 4096
could not prevent the 40k-token-sample OOM: oversized samples are
indivisible and land alone in their own bin at full length. It only doubled
the micro-batch count"). The scenario reads it back and observes the lowered
cap and a sample longer than it.

Unguarded: a naive launcher accepts the "fixed" plan; the memory model shows
what the cluster would meet (same 40,448-token micro-batch, still OOM, twice
the micro-batches). Guarded: ``t1ops.preflight.require_ok`` refuses it and
points at context parallelism; the suggested CP is then accepted.
Runbook: ``runbooks/max-tokens-per-gpu.md``.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.plan_launch import guarded_launch, launch
from t1ops.preflight import check_plan, load_plan
from t1ops.preflight.memory import binding_tokens_per_gpu, estimate

PLANS = Path(__file__).resolve().parents[2] / "examples" / "plans"
OOM_PLAN = PLANS / "qwen35-122b-56gpu.toml"


def write_lowered_cap_plan(tmp: Path) -> Path:
    """THE FAULT: the OOMing plan with the packer cap halved, as the report's team tried."""
    text = OOM_PLAN.read_text().replace("max_tokens_per_gpu = 8192", "max_tokens_per_gpu = 4096  # 'fix' for the OOM")
    path = tmp / "lowered-cap-plan.toml"
    path.write_text(text)
    return path


def micro_batches_per_gpu(plan) -> int:
    b, par = plan.batch, plan.parallelism
    return math.ceil(b.samples_per_step * b.mean_sample_tokens / (par.derived_dp * par.cp) / b.max_tokens_per_gpu)


def with_cp(plan, cp: int):
    return plan.model_copy(update={
        "parallelism": plan.parallelism.model_copy(update={"cp": cp}),
        "precision": plan.precision.model_copy(update={"gdn_native_cp": True})})


@register("max-tokens-per-gpu", "lowering max-tokens-per-GPU cannot fix an indivisible 40k-token sample's OOM")
def run(tmp: Path) -> Outcome:
    before, path = load_plan(OOM_PLAN), write_lowered_cap_plan(tmp)
    after = load_plan(path)
    fault_fired = (after.batch.max_tokens_per_gpu == 4096 < before.batch.max_tokens_per_gpu
                   and after.batch.binding_sample_tokens > after.batch.max_tokens_per_gpu)

    record = launch(path, tmp / "unguarded", guarded=False)
    est = estimate(after)
    unguarded = (f"naive launcher accepted the lowered cap ({record.name} written); the binding micro-batch is "
                 f"still {binding_tokens_per_gpu(after)} tokens per GPU, micro-batches per GPU per step went "
                 f"{micro_batches_per_gpu(before)} -> {micro_batches_per_gpu(after)}, and the step still OOMs at "
                 f"{est.binding.phase} ({est.binding.peak_bytes / 2**30:.1f} GiB > "
                 f"{after.hardware.gpu_memory_gib:g} GiB)")

    tl = Timeline()
    tl.fault()  # the faulty plan goes to the guarded launcher
    error, detection_s, finding_ids = guarded_launch(path, tmp / "guarded")
    if error:
        tl.detected()
    suggested = re.search(r"Raise cp to (\d+)", error)
    fixed_ok = bool(suggested) and check_plan(with_cp(before, int(suggested.group(1)))).verdict == "ok"
    tl.healthy()  # the runbook's fix passes the same preflight
    return Outcome(
        fault_fired=fault_fired,
        unguarded=unguarded,
        guarded=Guarded(caught=bool(error), detection_s=detection_s, error=error),
        invariants={
            "unguarded launch accepted the lowered cap": record.exists(),
            "binding micro-batch unchanged by the cap": binding_tokens_per_gpu(after) == binding_tokens_per_gpu(before),
            "micro-batch count doubled": micro_batches_per_gpu(after) == 2 * micro_batches_per_gpu(before),
            "still OOM after lowering the cap": not est.fits,
            "guarded launch never started": not (tmp / "guarded" / "launch.json").exists(),
            "refusal names max-tokens-per-gpu and says indivisible":
                "max-tokens-per-gpu" in finding_ids and "indivisible" in error,
            "the suggested cp is accepted by preflight": fixed_ok,
        },
        details={"finding_ids": finding_ids, "suggested_cp": suggested.group(1) if suggested else None},
        recovery=tl.recovery(how="refused before launch; the suggested cp accepted (runbook's fix)"),
    )
