"""rl/lean_megatron.py: megatron-core imported without TorchDynamo and wandb, the model unchanged."""
from __future__ import annotations

import json
import subprocess
import sys

# Builds the policy and critic, runs a forward and a backward, prints what was imported and the outputs.
_PROBE = r"""
import json, sys
import rl.lean_megatron as lean
if sys.argv[1] == "shipped":  # megatron as it imports without the finder
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, lean.LeanMegatronFinder)]
if sys.argv[2] == "wandb-first":
    import wandb
import torch
torch.set_num_threads(1)
from rl.model import ModelSpec, build_critic, build_policy, token_logprobs, values
spec = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, num_experts=8,
                 moe_router_topk=2, moe_ffn_hidden_size=64, max_seq_len=64, vocab_size=97)
gen = torch.Generator().manual_seed(1)
ids = torch.randint(0, 96, (2, 16), generator=gen)
policy, critic = build_policy(spec, seed=0, unk_id=96), build_critic(spec, seed=0)
dynamo_after_build = "torch._dynamo" in sys.modules  # the forward's activation checkpointing imports it itself
lp = token_logprobs(policy, ids, ids)
lp.sum().backward()
grad = sum(float(p.grad.abs().sum()) for p in policy.parameters() if p.grad is not None)
v = values(critic, ids)
import megatron.core.jit as jit
print(json.dumps({"engaged": lean.LeanMegatronFinder.engaged, "dynamo": dynamo_after_build,
                  "wandb": sys.modules.get("wandb") is not None, "jit_is_compile": jit.jit_fuser is torch.compile,
                  "compile_restored": torch.compile.__module__ == "torch",
                  "logprobs": lp.detach().flatten().tolist(), "grad": grad, "values": v.detach().flatten().tolist()}))
"""


def _probe(mode: str, wandb: str = "no-wandb") -> dict:
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", _PROBE, mode, wandb], capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_lean_import_skips_dynamo_and_wandb_and_changes_no_output():
    lean, shipped = _probe("lean"), _probe("shipped")
    assert lean["engaged"] and not lean["dynamo"] and not lean["wandb"], lean
    assert not lean["jit_is_compile"] and lean["compile_restored"]
    # the check can fail: megatron as shipped imports both and binds its fuser to torch.compile
    assert not shipped["engaged"] and shipped["dynamo"] and shipped["wandb"] and shipped["jit_is_compile"]
    for key in ("logprobs", "grad", "values"):
        assert lean[key] == shipped[key], key  # bit for bit: the fused paths never run on CPU


def test_a_process_that_imported_wandb_keeps_it():
    got = _probe("lean", "wandb-first")
    assert got["engaged"] and got["wandb"] and not got["dynamo"]
