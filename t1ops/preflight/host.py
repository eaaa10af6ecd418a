"""Host-RAM projection for one train node (report 09: the OS OOM kill).

With PPO's forced offload the idle role's state lives in host RAM, and with
optimizer CPU offload so does the fp32 Adam state of *both* models; sandbox
workers placed on a train node stack on top. The report's trainer died this
way with the GPUs at 38-44 of 95 GB and no CUDA error: only dmesg told.
"""
from __future__ import annotations

from t1ops.preflight import calibration as cal
from t1ops.preflight.params import gpu_params
from t1ops.preflight.plan import Plan


def host_ram_terms_gib(plan: Plan) -> dict[str, float]:
    """GiB of host RAM per train node, by term, at the rollout -> train handoff."""
    par, prec, hw = plan.parallelism, plan.precision, plan.hardware
    gpus = min(par.gpus_per_node, par.train_gpus)
    p = gpu_params(plan, par.pp - 1, "actor")  # the largest stage stands for every GPU
    expert_shard = max(1.0, par.train_gpus / (par.pp * par.ep * par.etp))
    opt_bytes = (p.expert / expert_shard + p.dense / (par.derived_dp * par.cp)) * prec.optimizer_bytes_per_param
    num_roles = 2 if plan.roles.critic else 1
    idle_backup = ((p.expert + p.dense) * prec.param_bytes + opt_bytes * (1 - prec.optimizer_offload_fraction)
                   if plan.roles.critic else 0.0)
    return {
        "offloaded_optimizer": gpus * num_roles * opt_bytes * prec.optimizer_offload_fraction / cal.GIB,
        "idle_role_backup": gpus * idle_backup / cal.GIB,
        "sandbox_workers": hw.sandbox_workers_per_train_node * hw.sandbox_worker_gib,
        "base": hw.host_base_gib,
    }
