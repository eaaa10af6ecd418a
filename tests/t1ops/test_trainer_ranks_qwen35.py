"""The Qwen3.5-MoE hybrid on real ranks: tp = 2 (+SP) + ep = 2, dp = 2, cp = 2 and pp = 2 (alone and with tp = 2 or
cp = 2), against one rank and against ``transformers``.

GatedDeltaNet's ``in_proj`` and ``conv1d`` are split over TP section by section (rl.trainer.shard), its
output norm's gradient is summed over TP (rl.trainer.grads). Same batch, same initial weights, one PPO
step with R3 on: per-token log-probs before the step (experts replayed from the bf16 sampler) within
1e-5 of the 1-rank trainer's; the 1-rank trainer's free-routing log-probs within 1e-4 of the log-softmax
of ``Qwen3_5MoeForCausalLM``'s logits on the exported weights (transformers cannot replay experts, so the
chain is ranks = 1 rank = transformers; each max printed); losses, grad norms and the weights after the
step as tests/t1ops/test_trainer_ranks.py checks them. At pp = 2 stage 0 holds the GatedDeltaNet layer and the
embedding, stage 1 the attention layer, the LM head and the critic's value head; the actor and critic steps run
the 1F1B schedule (rl.trainer.pipeline) and the results shown are rank 0's, i.e. the first stage's copy of
what the last stage computed.
"""
import pytest
import torch

from rl import model as rmodel
from rl.hf.checkpoint import export_hf
from rl.trainer import Trainer, TrainerSettings, rollout_batch, sample_responses
from rl.trainer.forward import actor_logprobs
from rl.trainer.ranks import Layout
from t1ops.campaign.trainer_rank import run_local_ranks

SPEC = rmodel.ModelSpec(arch="qwen3_5_moe", num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                        head_dim=16, ffn_hidden_size=64, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16,
                        shared_expert_intermediate_size=24, max_seq_len=64, vocab_size=64, rope_theta=1e4,
                        partial_rotary_factor=0.25, layer_types=("linear_attention", "full_attention"),
                        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                        linear_value_head_dim=8)
SETTINGS = TrainerSettings(mode="ppo", ppo_epochs=1, r3=True, actor_lr=1e-3)
CAP, TEMPERATURE = 40, 0.8


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    t = Trainer(SPEC, SETTINGS, seed=0, temperature=TEMPERATURE)
    sampler = rmodel.build_policy(SPEC, seed=7, dtype=torch.bfloat16)
    rmodel.load_state(sampler, rmodel.weights_state_dict(t.actor))
    seqs = sample_responses(sampler, [[1, 2, 3, 4]] * 6, 12, generator=torch.Generator().manual_seed(0))
    seqs = [s[: 8 + (i % 4) * 2] for i, s in enumerate(seqs)]
    batch = rollout_batch(sampler, seqs, [4] * 6, [0.1 * i for i in range(6)], [i // 2 for i in range(6)],
                          [i // 2 for i in range(6)], temperature=TEMPERATURE)
    logprobs = actor_logprobs(t.actor, batch, replay=True, temperature=TEMPERATURE).detach()
    out = tmp_path_factory.mktemp("hf") / "actor"
    export_hf(rmodel.weights_state_dict(t.actor), SPEC, out, tokenizer=False, meta={"role": "actor"})
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(input_ids=batch.tokens_BT[:, :-1]).logits.float() / TEMPERATURE
        hf_lp = torch.log_softmax(logits, -1).gather(-1, batch.tokens_BT[:, 1:].unsqueeze(-1)).squeeze(-1)
        free_lp = actor_logprobs(t.actor, batch, replay=False, temperature=TEMPERATURE)[:, 1:]
    hf_err = float((free_lp - hf_lp)[batch.loss_mask_BT[:, 1:]].abs().max())
    stats = t.train_step(batch)
    return batch, logprobs, hf_err, stats, rmodel.weights_state_dict(t.actor)


def test_one_rank_equals_transformers(reference):
    err = reference[2]
    print(f"1 rank vs transformers: max |log-prob difference| {err:.3e}")
    assert err <= 1e-4


# Every layout here is heavy (several ranks training the hybrid model: minutes each on 2 cores; run them
# with `pytest --heavy`, docs/testing.md "Heavy tests"). The default run proves the same step on ranks with
# the Qwen3-MoE stand-in in every layout (tests/t1ops/test_trainer_ranks.py) and GatedDeltaNet's context
# parallelism (tests/t1ops/test_context_parallel.py); this file's one-rank test stays in it.
_HEAVY = pytest.mark.heavy


@pytest.mark.parametrize("layout", [
    pytest.param(Layout(tp=2, ep=2, sequence_parallel=True, max_tokens_per_gpu=CAP), marks=_HEAVY),
    pytest.param(Layout(dp=2, max_tokens_per_gpu=CAP), marks=_HEAVY),
    pytest.param(Layout(cp=2, max_tokens_per_gpu=CAP), marks=_HEAVY),
    pytest.param(Layout(tp=2, cp=2, sequence_parallel=True, max_tokens_per_gpu=CAP), marks=_HEAVY),
    pytest.param(Layout(pp=2, max_tokens_per_gpu=CAP), marks=_HEAVY),
    pytest.param(Layout(pp=2, tp=2, sequence_parallel=True, max_tokens_per_gpu=CAP), marks=(_HEAVY, pytest.mark.slow)),
    pytest.param(Layout(pp=2, cp=2, max_tokens_per_gpu=CAP), marks=(_HEAVY, pytest.mark.slow))],
    ids=["tp2-sp-ep2", "dp2", "cp2", "tp2-sp-cp2", "pp2", "pp2-tp2-sp", "pp2-cp2"])
def test_layout_matches_one_rank_and_transformers(reference, layout):
    batch, ref_lp, hf_err, ref, ref_actor = reference
    got = run_local_ranks(layout, batch, SPEC, SETTINGS, seed=0, temperature=TEMPERATURE, own_shard=layout.dp > 1)
    to_one = float((got["logprobs"] - ref_lp)[batch.loss_mask_BT].abs().max())
    print(f"{layout}: max |log-prob difference| vs 1 rank {to_one:.3e} (1 rank vs transformers {hf_err:.3e})")
    assert to_one <= 1e-5
    for key in ("policy_loss", "value_loss", "actor_grad_norm", "critic_grad_norm"):
        assert got["stats"][key] == pytest.approx(getattr(ref, key), rel=1e-5, abs=1e-7), key
    assert set(got["actor"]) == set(ref_actor)
    assert max(float((got["actor"][k] - v).abs().max()) for k, v in ref_actor.items()) <= 1e-4
