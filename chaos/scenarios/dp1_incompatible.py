"""dp1-incompatible: a plan that requests DP = 1 for a 256-expert model.

Fault (real): the bad plan file is written to disk, as a user would: the
report's 128-GPU recipe with DP = 1 requested (T1 report, section 09: "DP = 1
forces all training GPUs into tensor x pipeline parallelism; the expert-parallel
identity then pins expert parallelism to 2 ... 128 experts per GPU —
guaranteed CUDA OOM"). The scenario reads the file back and observes that it
parses and really asks for DP = 1 with EP 16.

Unguarded: a naive launcher (parse, check that the GPU counts multiply, write
the launch record) accepts it; on a real cluster the job would reserve its
GPUs and die with CUDA OOM at the first step. Guarded: the same launcher calls
``t1ops.preflight.require_ok`` first and is refused with the arithmetic.
Runbook: ``runbooks/dp1-incompatible.md``.
"""
from __future__ import annotations

from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.plan_launch import guarded_launch, launch
from t1ops.preflight import check_plan, load_plan

PLANS = Path(__file__).resolve().parents[2] / "examples" / "plans"
GOOD_PLAN = PLANS / "qwen35-122b-128gpu-cp4.toml"


def write_dp1_plan(tmp: Path) -> Path:
    """THE FAULT: the recipe's plan edited to DP = 1 (all 32 train GPUs into tp x pp = 2 x 16)."""
    text = GOOD_PLAN.read_text()
    parallel = text[text.index("[parallelism]"):text.index("[batch]")]
    bad = ("[parallelism]\ntrain_gpus = 32\ntp = 2\npp = 16\ncp = 1\nep = 16\netp = 1\n"
           "dp = 1   # 'no data parallelism: one model replica'\n\n")
    path = tmp / "dp1-plan.toml"
    path.write_text(text.replace(parallel, bad))
    return path


@register("dp1-incompatible", "a DP = 1 plan pins EP at 2 (128 experts per GPU): certain CUDA OOM")
def run(tmp: Path) -> Outcome:
    path = write_dp1_plan(tmp)
    on_disk = load_plan(path)
    fault_fired = on_disk.parallelism.derived_dp == 1 and on_disk.parallelism.ep == 16

    record = launch(path, tmp / "unguarded", guarded=False)
    est = check_plan(on_disk).memory  # what the launch would have met on the GPUs
    unguarded = (f"naive launcher accepted the plan and wrote {record.name} for "
                 f"{on_disk.parallelism.train_gpus} GPUs (dp = 1, ep = 16 requested); on the cluster: CUDA OOM "
                 f"at {est.binding.phase} with a {est.binding.peak_bytes / 2**30:.1f} GiB peak on a "
                 f"{on_disk.hardware.gpu_memory_gib:g} GiB GPU")

    tl = Timeline()
    tl.fault()  # the faulty plan goes to the guarded launcher
    error, detection_s, finding_ids = guarded_launch(path, tmp / "guarded")
    if error:
        tl.detected()
    good_ok = check_plan(load_plan(GOOD_PLAN)).verdict == "ok"
    tl.healthy()  # the runbook's fix passes the same preflight
    return Outcome(
        fault_fired=fault_fired,
        unguarded=unguarded,
        guarded=Guarded(caught=bool(error), detection_s=detection_s, error=error),
        invariants={
            "unguarded launch record written": record.exists(),
            "unguarded plan's peak exceeds the GPU (the OOM it would meet)":
                est.binding.peak_bytes > on_disk.hardware.gpu_memory_gib * 2**30,
            "guarded launch never started": not (tmp / "guarded" / "launch.json").exists(),
            "refusal names dp1-incompatible": "dp1-incompatible" in finding_ids,
            "refusal carries the arithmetic (ep pinned at 2, 128 experts)":
                "tp*cp*dp/etp = 2" in error and "128 experts per layer" in error,
            "the recipe's cp4 plan is still accepted": good_ok,
        },
        details={"plan_parallelism": on_disk.parallelism.model_dump(), "finding_ids": finding_ids,
                 "peak_gib": round(est.binding.peak_bytes / 2**30, 2)},
        recovery=tl.recovery(how="refused before launch; the recipe's cp4 plan accepted (runbook's fix)"),
    )
