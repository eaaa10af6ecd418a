"""Structural checks of a plan, each returning findings a user can act on.

Every check is a pure function ``(plan, estimate) -> list[Finding]``; the
messages carry the arithmetic and cite the report (section 08 for the three
structural facts and native CP, section 09 for DP = 1, max-tokens-per-GPU and
the host OOM kill).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from t1ops.preflight import calibration as cal
from t1ops.preflight.host import TRAINER_TERMS, host_ram_terms_gib
from t1ops.preflight.memory import MemoryEstimate, estimate
from t1ops.preflight.params import gpu_params, layer_params, total_expert_params
from t1ops.preflight.plan import Plan

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "max-tokens-per-gpu": ("trainer.parallel.max_tokens_per_gpu", "run.plan"),
    "dp1-incompatible": ("trainer.parallel.dp", "trainer.parallel.ep", "run.plan"),
}

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    id: str
    severity: Severity
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / cal.GIB:.2f} GiB"


def check_memory(plan: Plan, est: MemoryEstimate) -> list[Finding]:
    """Does the binding phase fit the GPU, and which term binds."""
    b = est.binding
    where = f"{b.phase}, pipeline stage {b.stage}"
    if est.fits:
        return [Finding("memory", "info", f"peak {_gib(b.peak_bytes)} of {plan.hardware.gpu_memory_gib:g} GiB "
                        f"({where}); binding transient {b.binding_transient} {_gib(b.terms[b.binding_transient])}")]
    return [Finding("memory", "error",
                    f"predicted CUDA OOM at {where}: peak {_gib(b.peak_bytes)} > {plan.hardware.gpu_memory_gib:g} GiB. "
                    f"The failing request is ~{est.failing_request_bytes / cal.MIB:.0f} MiB in {b.binding_transient} "
                    f"with {_gib(est.in_use_at_failure_bytes)} in use. Raise cp or pp, or add train GPUs (report 08)")]


def max_valid_ep(plan: Plan) -> int:
    """Largest EP that divides the experts and fits in train_gpus / (pp * etp)."""
    par = plan.parallelism
    room = par.train_gpus // (par.pp * par.etp)
    return max(e for e in range(1, room + 1) if plan.model.num_experts % e == 0 and room % e == 0)


def effective_ep(plan: Plan) -> int:
    """The plan's EP if the layout can host it, else the largest EP it can."""
    par = plan.parallelism
    return par.ep if par.train_gpus % (par.pp * par.ep * par.etp) == 0 else max_valid_ep(plan)


def check_expert_identity(plan: Plan, est: MemoryEstimate) -> list[Finding]:
    """Expert optimizer bytes per GPU = expert params x 12 / train GPUs, whatever EP is (report 08)."""
    par, prec = plan.parallelism, plan.precision
    opt = total_expert_params(plan.model) * prec.optimizer_bytes_per_param / par.train_gpus
    out = [Finding("expert-parallel-identity", "info",
                   f"expert optimizer state per GPU = {total_expert_params(plan.model) / 1e9:.2f}B params x "
                   f"{prec.optimizer_bytes_per_param} B / {par.train_gpus} train GPUs = {_gib(opt)}; EP cancels "
                   "(params per rank scale 1/EP, the optimizer shard factor scales EP), only more train GPUs shrink it")]
    best = max_valid_ep(plan)
    if par.ep < best and par.derived_dp > 1:
        stage = par.pp - 1
        wg = prec.param_bytes + prec.main_grad_bytes
        now = gpu_params(plan, stage, "actor").expert * wg
        out.append(Finding("expert-parallel-identity", "warning",
                           f"ep = {par.ep} is below the maximal {best}: expert weights+grads are {_gib(now)} per GPU "
                           f"instead of {_gib(now * par.ep / best)} ({best // par.ep}x) for zero optimizer saving; set ep = {best}"))
    return out


def check_tensor_parallel(plan: Plan, est: MemoryEstimate) -> list[Finding]:
    """TP beyond 2 buys nothing for this model (report 08)."""
    m, tp = plan.model, plan.parallelism.tp
    if tp <= 2 or m.num_gdn_layers == 0:  # the argument rests on the replicated GatedDeltaNet blocks
        return []
    gdn_b = m.num_gdn_layers * layer_params(m).gdn / 1e9
    kv = f"; tp {tp} > {m.num_kv_groups} KV groups enters the KV-replication branch" if tp > m.num_kv_groups else ""
    return [Finding("tensor-parallel", "warning",
                    f"tp = {tp} buys nothing over 2: the {gdn_b:.2f}B GatedDeltaNet params are plain linear layers, "
                    f"replicated on every TP rank, and the sequence is all-gathered before them, so their activation "
                    f"peak does not shrink{kv}. Use tp = 2 and spend the GPUs on pp or cp (report 08)")]


def check_gdn_cp(plan: Plan, est: MemoryEstimate) -> list[Finding]:
    """CP > 1 needs native GatedDeltaNet CP; the generic recurrent scan is not CP-safe (report 08)."""
    if plan.parallelism.cp == 1 or plan.precision.gdn_native_cp or plan.model.num_gdn_layers == 0:
        return []
    return [Finding("gdn-cp", "error",
                    f"cp = {plan.parallelism.cp} with gdn_native_cp = false: GatedDeltaNet's recurrent scan is not "
                    "CP-safe in the generic path; set precision.gdn_native_cp = true or cp = 1")]


def check_dp1(plan: Plan, est: MemoryEstimate) -> list[Finding]:
    """DP = 1 pins EP to TP x CP / ETP: 2 for this model -> 128 experts per GPU (report 09)."""
    par, m = plan.parallelism, plan.model
    if par.derived_dp != 1:
        return []
    cap = par.tp * par.cp // par.etp
    ep = min(par.ep, cap)
    per_gpu = m.num_experts // ep
    if per_gpu < cal.MAX_EXPERTS_PER_GPU:
        return [Finding("dp1-incompatible", "warning",
                        f"dp = 1 caps EP at tp*cp/etp = {cap}: {per_gpu} experts per GPU per layer")]
    worst = estimate(plan.model_copy(update={"precision": plan.precision.model_copy(
        update={"optimizer_offload_fraction": 1.0, "full_recompute": True})}), ep=ep)
    wg = gpu_params(plan, par.pp - 1, "actor", ep).expert * (plan.precision.param_bytes + plan.precision.main_grad_bytes)
    headroom = est.capacity_bytes - worst.binding.peak_bytes
    offload = (f"even with full recompute and full optimizer offload the peak is {_gib(worst.binding.peak_bytes)} "
               f"> {plan.hardware.gpu_memory_gib:g} GiB" if headroom < 0 else
               f"full optimizer offload would leave only {_gib(headroom)} of headroom, comparable to the model's "
               "error on the report's peaks (0.35 GiB), with the host holding every optimizer byte")
    return [Finding("dp1-incompatible", "error",
                    f"dp = 1 puts all {par.train_gpus} train GPUs into tp x pp x cp = {par.tp} x {par.pp} x {par.cp}; "
                    f"the expert identity then pins ep <= tp*cp*dp/etp = {cap} (ep = {par.ep} requested), so each GPU "
                    f"holds {m.num_experts} / {ep} = {per_gpu} experts per layer: {_gib(wg)} of expert weights+grads on "
                    f"{plan.layers_per_stage} layers; {offload}. More GPUs only add pipeline stages: ep stays {cap} "
                    f"and every GPU keeps {per_gpu} experts per layer, so scale cannot fix it. Let dp > 1 and keep ep "
                    "maximal (report 09)")]


def _fitting_cp(plan: Plan) -> int | None:
    """Smallest CP (a power of two the layout allows) at which the plan fits, with native GDN CP."""
    par = plan.parallelism
    room = par.train_gpus // (par.tp * par.pp)
    for cp in (2**k for k in range(1, int(math.log2(room)) + 1)):
        if room % cp or cp <= par.cp:
            continue
        trial = plan.model_copy(update={
            "parallelism": par.model_copy(update={"cp": cp, "dp": None}),
            "precision": plan.precision.model_copy(update={"gdn_native_cp": True})})
        if estimate(trial, ep=effective_ep(trial)).fits:
            return cp
    return None


def check_max_tokens(plan: Plan, est: MemoryEstimate) -> list[Finding]:
    """A sample longer than the packer cap is indivisible: lowering the cap cannot fix its OOM (report 09)."""
    par, b = plan.parallelism, plan.batch
    per_gpu = math.ceil(b.binding_sample_tokens / par.cp)
    if est.fits or per_gpu <= b.max_tokens_per_gpu:
        return []
    tokens_per_rank = b.samples_per_step * b.mean_sample_tokens / (par.derived_dp * par.cp)
    mbs = math.ceil(tokens_per_rank / b.max_tokens_per_gpu)
    cp = _fitting_cp(plan)
    fix = (f"Raise cp to {cp} (with native GatedDeltaNet CP): CP splits the sample itself." if cp
           else "No cp this layout allows fits it: add train GPUs or shorten the wall.")
    return [Finding("max-tokens-per-gpu", "error",
                    f"lowering max_tokens_per_gpu (now {b.max_tokens_per_gpu}) cannot fix this OOM: the "
                    f"{b.binding_sample_tokens}-token sample is indivisible and lands alone in its own bin at "
                    f"{per_gpu} tokens per GPU whatever the cap; the cap only sets the micro-batch count (~{mbs} per "
                    f"GPU per step now, twice that at half the cap). {fix} (report 09)")]


def check_host_ram(plan: Plan, est: MemoryEstimate) -> list[Finding]:
    """Offloaded fp32 Adam of both models + idle-role backup + sandbox workers vs host RAM (report 09)."""
    terms = host_ram_terms_gib(plan)
    total, ram = sum(terms.values()), plan.hardware.host_ram_gib
    detail = " + ".join(f"{k} {v:.0f}" for k, v in terms.items())
    if total <= ram * cal.HOST_RAM_SAFE_FRACTION:
        return [Finding("host-ram", "info", f"host RAM per train node {total:.0f} of {ram:g} GiB ({detail})")]
    top = max(terms, key=terms.get)
    why = f" ({TRAINER_TERMS[top]})" if top in TRAINER_TERMS else ""
    return [Finding("host-ram", "error",
                    f"host RAM per train node {total:.0f} GiB ({detail}) is {total / ram:.0%} of {ram:g} GiB, above "
                    f"{cal.HOST_RAM_SAFE_FRACTION:.0%}: the OS OOM killer will take the trainer (no CUDA error; look in "
                    f"dmesg). The largest term is {top} ({terms[top]:.0f} GiB){why}. Move sandbox workers to rollout "
                    "nodes or offload less optimizer state (report 09)")]


def check_routing_record(plan: Plan, est: MemoryEstimate) -> list[Finding]:
    """Size of R3's routing record (report 05: 1536 B/token, ~48 MiB for 33k tokens)."""
    m, b = plan.model, plan.batch
    if not plan.precision.r3:
        return []
    per_token = m.num_layers * m.moe_router_topk * cal.ROUTING_ID_BYTES
    return [Finding("routing-record", "info",
                    f"routing record {m.num_layers} layers x top-{m.moe_router_topk} x 4 B = {per_token} B/token: "
                    f"{b.mean_sample_tokens * per_token / cal.MIB:.0f} MiB per {b.mean_sample_tokens}-token trajectory")]


def check_trainer_layout(plan: Plan, est: MemoryEstimate) -> list[Finding]:
    """Whether t1ops' rank trainer runs this layout: the rules a campaign's ``[trainer.parallel]`` passes
    (t1ops.parallel_layout) and the layouts ``rl.trainer.settings.Layout`` accepts (docs/parallelism.md)."""
    from pydantic import ValidationError

    from rl.trainer.settings import Layout
    from t1ops.parallel_layout import trainer_errors

    par, m = plan.parallelism, plan.model
    keys = dict(dp=par.derived_dp, tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep, sequence_parallel=par.tp > 1)
    spelled = ", ".join(f"{k} = {str(v).lower()}" for k, v in keys.items())
    errors = trainer_errors(**keys, num_layers=m.num_layers, num_experts=m.num_experts,
                            num_attention_heads=m.num_attention_heads, num_query_groups=m.num_kv_groups,
                            etp=par.etp)
    if par.etp != 1:
        errors.append(f"etp = {par.etp}: the trainer's expert tensor parallelism is 1")
    try:
        Layout(**keys)
    except ValidationError as exc:
        errors.append(str(exc.errors()[0]["msg"]))
    if errors:
        return [Finding("trainer-layout", "info", f"t1ops' rank trainer does not run this layout ({spelled}): "
                        + "; ".join(errors))]
    return [Finding("trainer-layout", "info", f"t1ops' rank trainer runs this layout: [trainer.parallel] {spelled}")]


ALL_CHECKS = (check_memory, check_gdn_cp, check_dp1, check_max_tokens, check_expert_identity,
              check_tensor_parallel, check_host_ram, check_routing_record, check_trainer_layout)
