"""The rank trainer on CUDA/NCCL against its CPU numbers (needs a GPU for --check).

Step 1, on the CPU machine: ``python bench/cuda_check_ranks.py --make-reference ref.pt`` builds a
tiny batch (R3 rows from a bf16 sampler), the 1-rank trainer's initial weights, its per-token
log-probs and one PPO step's numbers. Step 2, on the GPU machine (megatron-core, pydantic,
opentelemetry and pybase64 installed): ``python bench/cuda_check_ranks.py --check ref.pt`` joins a
world of 1 through ``t1ops.campaign.trainer_rank.join_world`` with NCCL (``apply_nccl_env`` sets
the TORCH_NCCL_* variables), builds the ``RankTrainer`` on the GPU from the same weights and prints
the log-prob and loss / grad-norm differences as JSON (docs/parallelism.md has one run's figures).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch


def make_reference(path: str) -> None:
    from rl import model as rmodel
    from rl.trainer import Trainer, TrainerSettings, rollout_batch, sample_responses
    from rl.trainer.forward import actor_logprobs

    spec = rmodel.ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                            num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64, max_seq_len=128, vocab_size=128)
    settings = TrainerSettings(mode="ppo", ppo_epochs=1, r3=True, actor_lr=1e-3)
    t = Trainer(spec, settings, seed=0)
    init = tuple({k: v.clone() for k, v in rmodel.weights_state_dict(m).items()} for m in (t.actor, t.critic))
    sampler = rmodel.build_policy(spec, seed=7, dtype=torch.bfloat16)
    rmodel.load_state(sampler, rmodel.weights_state_dict(t.actor))
    seqs = sample_responses(sampler, [[1, 2, 3, 4]] * 8, 28, generator=torch.Generator().manual_seed(0))
    seqs = [s[: 16 + (i % 4) * 4] for i, s in enumerate(seqs)]
    batch = rollout_batch(sampler, seqs, [4] * 8, [0.1 * i for i in range(8)], [i // 2 for i in range(8)],
                          [i // 2 for i in range(8)])
    lp = actor_logprobs(t.actor, batch, replay=True).detach()
    stats = t.train_step(batch)
    torch.save({"spec": spec, "settings": settings, "batch": batch, "actor": init[0], "critic": init[1],
                "ref_lp": lp, "ref_stats": stats.as_dict()}, path)


def check(path: str) -> dict:
    import torch.distributed as dist

    from rl.trainer.ranks import Layout, RankTrainer
    from t1ops.campaign.trainer_rank import join_world
    from t1ops.config import GuardsConfig

    d = torch.load(path, weights_only=False)
    out = {"device": torch.cuda.get_device_name(0)}
    layout = Layout(max_tokens_per_gpu=64)
    timeout = join_world(0, 1, "tcp://127.0.0.1:29531", layout, guards=GuardsConfig(), backend="nccl")
    out.update(backend=dist.get_backend(), timeout_s=timeout.total_seconds(),
               nccl_env={k: v for k, v in os.environ.items() if k.startswith("TORCH_NCCL")})
    rt = RankTrainer(d["spec"], d["settings"], layout, full_actor=d["actor"], full_critic=d["critic"],
                     unk_id=None, seed=0)
    out["param_device"] = str(next(rt.actor.parameters()).device)
    lp = rt.logprobs(d["batch"])
    out["lp_maxdiff"] = float((lp - d["ref_lp"])[d["batch"].loss_mask_BT].abs().max())
    t0 = time.time()
    st = rt.train_step(d["batch"]).as_dict()
    out["step_s"], out["micro_batches"] = time.time() - t0, len(rt.plan(d["batch"]))
    for k in ("policy_loss", "value_loss", "actor_grad_norm", "critic_grad_norm", "explained_variance"):
        ref = d["ref_stats"][k]
        out[k] = {"cuda": st[k], "cpu": ref, "rel": abs(st[k] - ref) / max(1e-12, abs(ref))}
    out["gathered_tensors"] = len(rt.full_state("actor"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--make-reference", metavar="PATH")
    group.add_argument("--check", metavar="PATH")
    args = ap.parse_args()
    if args.make_reference:
        make_reference(args.make_reference)
    else:
        print(json.dumps(check(args.check), indent=1))


if __name__ == "__main__":
    main()
