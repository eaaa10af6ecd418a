"""Equivalence: a TP=2 (+SP), an EP=2, a DP=2, a TP=2+EP=2, a CP=2+EP=2 and a PP=2 trainer against the
1-rank trainer, R3 on.

Same batch, same initial weights (layout-free, rl.trainer.ranks.full_initial_states), one PPO
step (critic + actor, ppo_epochs=1). Tolerances: per-token log-probs within 1e-5 (absolute, loss
tokens), policy loss, value loss and both grad norms within 1e-5 (relative), weights after the step
within 1e-4 (Adam's first step divides by |g|, so 1e-7 grad differences show as ~1e-6). The small
max_tokens_per_gpu cuts every rank's share into several micro-batches (gradient accumulation).
Each test spawns 2 real rank processes (gloo, groups through t1ops.guards.dist).
"""
import pytest
import torch
from safetensors.torch import load_file

from rl import model as rmodel
from rl.trainer import Trainer, TrainerSettings, rollout_batch, sample_responses
from rl.trainer.forward import actor_logprobs
from rl.trainer.ranks import Layout
from rl.trainer.shard import Placement
from rl.hf import layout as hf_layout
from rl.hf.checkpoint import export_hf
from rl.weights.checksums import state_checksums
from t1ops.campaign.trainer_rank import run_local_ranks
from t1ops.errors import CheckpointError, CheckpointRoleError
from t1ops.guards.checkpoints import save_checkpoint
from t1ops.guards.sharded_checkpoints import CheckpointReader, commit, load_role, shard_dir, write_shard

SPEC = rmodel.ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_experts=4,
                        moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=64, vocab_size=64)
SETTINGS = TrainerSettings(mode="ppo", ppo_epochs=1, r3=True, actor_lr=1e-3)
CAP = 40  # tokens per micro-batch: 2-3 micro-batches per rank
TEMPERATURE = 0.8  # the trainer's log-probs are at the sampling temperature


@pytest.fixture(scope="module")
def reference():
    t = Trainer(SPEC, SETTINGS, seed=0, temperature=TEMPERATURE)
    sampler = rmodel.build_policy(SPEC, seed=7, dtype=torch.bfloat16)  # another numerical implementation
    rmodel.load_state(sampler, rmodel.weights_state_dict(t.actor))
    seqs = sample_responses(sampler, [[1, 2, 3, 4]] * 6, 12, generator=torch.Generator().manual_seed(0))
    seqs = [s[: 8 + (i % 4) * 2] for i, s in enumerate(seqs)]  # lengths 8..14: packing has work to do
    batch = rollout_batch(sampler, seqs, [4] * 6, [0.1 * i for i in range(6)], [i // 2 for i in range(6)],
                          [i // 2 for i in range(6)], temperature=TEMPERATURE)
    logprobs = actor_logprobs(t.actor, batch, replay=True, temperature=TEMPERATURE).detach()
    stats = t.train_step(batch)
    return batch, logprobs, stats, rmodel.weights_state_dict(t.actor)


@pytest.mark.parametrize("layout", [Layout(tp=2, sequence_parallel=True, max_tokens_per_gpu=CAP),
                                    Layout(dp=2, ep=2, max_tokens_per_gpu=CAP),
                                    Layout(dp=2, max_tokens_per_gpu=CAP),
                                    Layout(tp=2, ep=2, sequence_parallel=True, max_tokens_per_gpu=CAP),
                                    Layout(cp=2, ep=2, max_tokens_per_gpu=CAP), Layout(pp=2, max_tokens_per_gpu=CAP)],
                         ids=["tp2-sp", "ep2", "dp2", "tp2-sp-ep2", "cp2-ep2", "pp2"])
def test_layout_matches_one_rank(reference, layout, tmp_path):
    batch, ref_lp, ref, ref_actor = reference
    # dp > 1: each rank holds routing rows for its own rows only, as in a campaign (dataplane.fetch_shard)
    got = run_local_ranks(layout, batch, SPEC, SETTINGS, seed=0, temperature=TEMPERATURE, shards_to=str(tmp_path),
                          own_shard=layout.dp > 1, sync_to=str(tmp_path / "export"))
    assert got["micro_batches"] >= 2  # gradient accumulation is exercised
    mask = batch.loss_mask_BT
    assert float((got["logprobs"] - ref_lp)[mask].abs().max()) <= 1e-5
    assert ref.logprob_gap > 0  # the bf16 sampler differs: the gap is a real number, not 0 == 0
    for key in ("policy_loss", "value_loss", "actor_grad_norm", "critic_grad_norm", "explained_variance",
                "logprob_gap", "tis_mean"):
        assert got["stats"][key] == pytest.approx(getattr(ref, key), rel=1e-5, abs=1e-7), key
    assert set(got["actor"]) == set(ref_actor)  # gathered from the ranks: a full, layout-free state
    assert max(float((got["actor"][k] - v).abs().max()) for k, v in ref_actor.items()) <= 1e-4

    # the ranks' sharded checkpoint (one file per rank, one manifest) reassembles into the same weights,
    # and loads at another layout: here a world of 1
    full, manifest = load_role(shard_dir(tmp_path, "actor", 1), "actor")
    assert len(manifest["shards"]) == layout.world_size
    assert all(torch.equal(full[k], got["actor"][k]) for k in ref_actor)
    one_rank = rmodel.build_policy(SPEC, seed=0)
    rmodel.load_state(one_rank, full)

    # the weight sync from every rank's shard (nothing gathered): each tensor sent by exactly one rank, both
    # ranks send, and what they send and hash is the full state's Hugging Face tensors (rl.weights.shard_plan)
    parts, sums = [p for p, _ in got["sync"]], {k: v for _, c in got["sync"] for k, v in c.items()}
    names = [n for p in parts for n in p]
    assert len(names) == len(set(names)) == len(hf_layout.hf_shapes(SPEC)) and all(parts)
    hf = hf_layout.to_hf(got["actor"], SPEC)
    for f in {f for p in parts for f in p.values()}:
        for n, t in load_file(tmp_path / "export" / f).items():
            assert torch.equal(t, hf[n]), n
    assert sums == state_checksums(got["actor"], torch.float32)


def test_sharded_checkpoint_refuses_corruption_and_the_other_role(tmp_path):
    policy = rmodel.build_policy(SPEC, seed=0)
    where = {n: Placement(n, None) for n in rmodel.weights_state_dict(policy)}
    step_dir = shard_dir(tmp_path, "actor", 3)
    partial = step_dir.with_name(".partial-" + step_dir.name)
    entry = write_shard(partial, 0, where, rmodel.weights_state_dict(policy))
    assert not step_dir.exists()  # not committed: a resume never sees the step
    commit(partial, step_dir, "actor", 3, {"dp": 1}, [entry])
    assert set(load_role(step_dir, "actor")[0]) == set(where) and not partial.exists()
    with pytest.raises(CheckpointRoleError):
        load_role(step_dir, "critic")
    with pytest.raises(CheckpointError, match="saved by shard"):  # the whole-file loader names the reader
        __import__("t1ops.guards.checkpoints", fromlist=["x"]).load_checkpoint(step_dir, "actor")
    shard = step_dir / entry["file"]
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        load_role(step_dir, "actor")


def test_checkpoint_by_shard_resumes_own_file_or_reshards(reference, tmp_path):
    """Saved by shard at TP = 2 + EP = 2 (no gather: each rank its own file, the manifest says who holds
    which slice); loaded at the same layout each rank reads its own file, at DP = 2 and at 1 rank each
    re-shards tensor by tensor; every load equals the saved weights bit for bit, both roles."""
    batch = reference[0]
    tp_ep = Layout(tp=2, ep=2, sequence_parallel=True, max_tokens_per_gpu=CAP)
    saved = run_local_ranks(tp_ep, batch, SPEC, SETTINGS, seed=0, temperature=TEMPERATURE, shards_to=str(tmp_path))
    dirs = {role: str(shard_dir(tmp_path, role, 1)) for role in ("actor", "critic")}
    tensors = CheckpointReader(dirs["actor"], "actor").manifest["tensors"]
    split = [n for n, m in tensors.items() if m["pieces"][0]["dim"] is not None]
    experts = {p["rank"] for n, m in tensors.items() if ".experts." in n for p in m["pieces"]}
    assert split and all(len(tensors[n]["pieces"]) == 2 for n in split) and experts == {0, 1}
    for layout, how in ((tp_ep, "own shard"), (Layout(dp=2, max_tokens_per_gpu=CAP), "re-sharded")):
        got = run_local_ranks(layout, batch, SPEC, SETTINGS, seed=3, temperature=TEMPERATURE, steps=0,
                              load_from=dirs)
        assert got["loaded"] == [{"actor": how, "critic": how}] * 2
        for role in ("actor", "critic"):
            assert all(torch.equal(got[role][k], v) for k, v in saved[role].items()), (layout, role)
    # the trainer state saved beside them (each rank's optimizer and RNG) resumes here too: "own state" at
    # the saved layout; another layout is t1ops/campaign/reshard.py's (test below)
    got = run_local_ranks(tp_ep, batch, SPEC, SETTINGS, seed=3, temperature=TEMPERATURE, steps=0, load_from=dirs,
                          state_from=(str(tmp_path), 1))
    assert [x["trainer_state"] for x in got["loaded"]] == ["own state"] * 2
    # the streaming HF export of the TP = 2 + EP = 2 shards equals the export of the same weights saved whole
    from safetensors.torch import load_file

    one_dir = save_checkpoint(tmp_path / "one" / "actor", "actor", 1, saved["actor"])
    for name, source in (("shards", dirs["actor"]), ("whole", one_dir)):
        export_hf(CheckpointReader(source, "actor"), SPEC, tmp_path / name, tokenizer=False)
    a, b = (load_file(tmp_path / name / "model.safetensors") for name in ("shards", "whole"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    one = Trainer(SPEC, SETTINGS, seed=3, temperature=TEMPERATURE)
    for role, model in (("actor", one.actor), ("critic", one.critic)):
        assert one.load_role(role, CheckpointReader(dirs[role], role)) == "re-sharded"
        assert all(torch.equal(rmodel.weights_state_dict(model)[k], v) for k, v in saved[role].items())


def test_dp2_fully_async_behaviour_matches_one_rank():
    """behaviour="rollout" (fully async: the rollout's per-token log-probs are the PPO ratio's
    denominator) takes the same step on 2 data-parallel ranks as on 1 (rl.trainer.step.behaviour_plan)."""
    t = Trainer(SPEC, SETTINGS, seed=0, temperature=TEMPERATURE)
    sampler = rmodel.build_policy(SPEC, seed=7, dtype=torch.bfloat16)
    rmodel.load_state(sampler, rmodel.weights_state_dict(t.actor))
    seqs = sample_responses(sampler, [[1, 2, 3, 4]] * 4, 8, generator=torch.Generator().manual_seed(1))
    batch = rollout_batch(sampler, seqs, [4] * 4, [0.0, 1.0, 0.5, 0.2], [0, 0, 1, 1], [0, 0, 1, 1],
                          temperature=TEMPERATURE)
    snapshot = Trainer(SPEC, SETTINGS, seed=0, temperature=TEMPERATURE).train_step(batch)
    ref = t.train_step(batch, behaviour="rollout")
    assert ref.policy_loss != pytest.approx(snapshot.policy_loss, rel=1e-6)  # the denominator really differs
    got = run_local_ranks(Layout(dp=2, max_tokens_per_gpu=CAP), batch, SPEC, SETTINGS, seed=0,
                          temperature=TEMPERATURE, behaviour="rollout", own_shard=True)
    for key in ("policy_loss", "value_loss", "actor_grad_norm", "ratio_mean", "logprob_gap"):
        assert got["stats"][key] == pytest.approx(getattr(ref, key), rel=1e-5, abs=1e-7), key


def test_a_resume_at_another_layout_reshards_the_optimizer_and_continues_the_same_run(reference, tmp_path):
    """Saved at TP = 2 + EP = 2 after one step (weights by shard, each rank's Adam moments in its own file),
    resumed at DP = 2 (re-sharded: t1ops/campaign/reshard.py): its second step lands where a 1-rank trainer's
    two uninterrupted steps land. Without the optimizer state (a fresh Adam) it does not: the check can fail."""
    batch = reference[0]
    tp_ep = Layout(tp=2, ep=2, sequence_parallel=True, max_tokens_per_gpu=CAP)
    run_local_ranks(tp_ep, batch, SPEC, SETTINGS, seed=0, temperature=TEMPERATURE, shards_to=str(tmp_path))
    dirs = {role: str(shard_dir(tmp_path, role, 1)) for role in ("actor", "critic")}
    t = Trainer(SPEC, SETTINGS, seed=0, temperature=TEMPERATURE)
    for _ in range(2):
        t.train_step(batch)
    want = rmodel.weights_state_dict(t.actor)
    dp2 = Layout(dp=2, max_tokens_per_gpu=CAP)
    got = run_local_ranks(dp2, batch, SPEC, SETTINGS, seed=3, temperature=TEMPERATURE, load_from=dirs,
                          state_from=(str(tmp_path), 1), own_shard=True)
    assert got["loaded"] == [{"actor": "re-sharded", "critic": "re-sharded", "trainer_state": "re-sharded"}] * 2
    assert max(float((got["actor"][k] - v).abs().max()) for k, v in want.items()) <= 1e-4
    fresh = run_local_ranks(dp2, batch, SPEC, SETTINGS, seed=3, temperature=TEMPERATURE, load_from=dirs,
                            own_shard=True)
    assert max(float((fresh["actor"][k] - v).abs().max()) for k, v in want.items()) > 1e-3
