"""Mini-batches (``trainer.mini_batches``) and the LR warmup on 2 data-parallel ranks take the same
steps as on 1 rank: the split is by prompt group over the whole batch, each part reduced on its own
(rl.trainer.packing.mini_batch_rows), so the ranks agree on every optimizer step (issue 55)."""
import pytest
import torch

from rl import model as rmodel
from rl.trainer import Trainer, TrainerSettings, rollout_batch, sample_responses
from rl.trainer.ranks import Layout
from t1ops.campaign.trainer_rank import run_local_ranks

SPEC = rmodel.ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_experts=4,
                        moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=64, vocab_size=64)
SETTINGS = TrainerSettings(mode="ppo", ppo_epochs=2, r3=True, actor_lr=1e-3, mini_batches=3, lr_warmup_steps=2)


@pytest.mark.parametrize("layout", [Layout(dp=2, max_tokens_per_gpu=40), Layout(dp=2, ep=2, max_tokens_per_gpu=40)],
                         ids=["dp2", "dp2-ep2"])  # ep: aligned micro-batches, a part may leave a rank only fillers
def test_dp2_mini_batches_match_one_rank(tmp_path, layout):
    t = Trainer(SPEC, SETTINGS, seed=0)
    sampler = rmodel.build_policy(SPEC, seed=7, dtype=torch.bfloat16)
    rmodel.load_state(sampler, rmodel.weights_state_dict(t.actor))
    seqs = sample_responses(sampler, [[1, 2, 3, 4]] * 12, 10, generator=torch.Generator().manual_seed(0))
    seqs = [s[: 8 + (i % 3) * 2] for i, s in enumerate(seqs)]
    batch = rollout_batch(sampler, seqs, [4] * 12, [0.1 * (i % 5) for i in range(12)], [i // 2 for i in range(12)],
                          [i // 2 for i in range(12)])
    ref = t.train_step(batch)
    assert ref.optimizer_steps == 6 and ref.actor_lr == pytest.approx(5e-4)  # 2 epochs x 3 parts; warmup 1/2
    got = run_local_ranks(layout, batch, SPEC, SETTINGS, seed=0,
                          shards_to=str(tmp_path), own_shard=True)
    for key in ("policy_loss", "value_loss", "actor_grad_norm", "critic_grad_norm", "kl_behaviour", "logprob_gap"):
        assert got["stats"][key] == pytest.approx(getattr(ref, key), rel=1e-5, abs=1e-7), key
    assert got["stats"]["optimizer_steps"] == 6
    ref_actor = rmodel.weights_state_dict(t.actor)
    assert max(float((got["actor"][k] - v).abs().max()) for k, v in ref_actor.items()) <= 1e-4
