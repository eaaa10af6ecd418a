"""Host-RAM projection for one train node (report 09: the OS OOM kill), and t1ops' own gathers.

With PPO's forced offload the idle role's state lives in host RAM, and with
optimizer CPU offload so does the fp32 Adam state of *both* models; sandbox
workers placed on a train node stack on top. The report's trainer died this
way with the GPUs at 38-44 of 95 GB and no CUDA error: only dmesg told.

t1ops' trainer adds two terms of its own (:data:`TRAINER_TERMS`; docs/weights.md, "Host memory
of sync and checkpoints"), counted on the node of trainer rank 0, the worst node:

- ``weight_sync``: nothing gathers the model for the engines' weight sync (every rank sends the
  tensors it owns, ``rl.weights.shard_plan``); each process assembles and converts at most one
  bucket on its way out (``engine.weight_sync_bucket_mb``, 512 MiB by default), staged through host
  memory at worst. Its two kept versions (the behaviour snapshots, the delta's base) are copies of
  its shard on the GPU, in the device budget, not here;
- ``checkpoint_save``: at ``save_every`` each rank writes its own shard of both roles and its own
  optimizer and RNG state (checkpoints by shard, ``t1ops.guards.sharded_checkpoints``), nothing
  gathered; ``torch.save`` copies a device tensor to host one storage at a time, so per process
  about its largest tensor (the embedding's shard, in fp32 optimizer state).
"""
from __future__ import annotations

from t1ops.preflight import calibration as cal
from t1ops.preflight.params import gpu_params, layer_params
from t1ops.preflight.plan import Plan

# The terms t1ops' trainer adds to the report's (the report's own trainer gathered neither).
TRAINER_TERMS = {
    "weight_sync": "every rank sends its own shard: one bucket per process on its way to the engines "
                   "(docs/weights.md, 'Every rank sends its shard')",
    "checkpoint_save": "each rank writes its own shard, one tensor at a time on its way to disk",
}
SYNC_BUCKET_GIB = 0.5  # engine.weight_sync_bucket_mb's default: one bucket per process at a time


def host_ram_terms_gib(plan: Plan) -> dict[str, float]:
    """GiB of host RAM per train node, by term, at the rollout -> train handoff (rank 0's node)."""
    par, prec, hw = plan.parallelism, plan.precision, plan.hardware
    gpus = min(par.gpus_per_node, par.train_gpus)
    p = gpu_params(plan, par.pp - 1, "actor")  # the largest stage stands for every GPU
    expert_shard = max(1.0, par.train_gpus / (par.pp * par.ep * par.etp))
    opt_bytes = (p.expert / expert_shard + p.dense / (par.derived_dp * par.cp)) * prec.optimizer_bytes_per_param
    num_roles = 2 if plan.roles.critic else 1
    idle_backup = ((p.expert + p.dense) * prec.param_bytes + opt_bytes * (1 - prec.optimizer_offload_fraction)
                   if plan.roles.critic else 0.0)
    largest = layer_params(plan.model).embedding / par.tp * max(prec.param_bytes, 4)  # fp32 optimizer state
    return {
        "offloaded_optimizer": gpus * num_roles * opt_bytes * prec.optimizer_offload_fraction / cal.GIB,
        "idle_role_backup": gpus * idle_backup / cal.GIB,
        "sandbox_workers": hw.sandbox_workers_per_train_node * hw.sandbox_worker_gib,
        "base": hw.host_base_gib,
        "weight_sync": gpus * SYNC_BUCKET_GIB,
        "checkpoint_save": gpus * largest / cal.GIB,
    }
