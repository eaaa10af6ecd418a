"""Pipeline parallelism on real ranks: pp = 2 against one rank, Qwen3.5-MoE hybrid, R3 on.

Two gloo ranks, stage 0 holding layers 0-1 and the embedding, stage 1 layers 2-3, the final norm and the
LM head (``rl.trainer.pipeline``); the packer's micro-batches (``rl.trainer.packing``, a token cap that
makes several) go through the 1F1B schedule; each stage replays the R3 rows of its own layers. The same
code with one stage is the reference. Equal: per-token log-probs before the step, the PPO loss, the
global grad norm and every weight after one AdamW step (``rl.trainer.grads.reduce_clip_step``).
"""
import os
import tempfile

import pytest
import torch

from rl import model as rmodel
from rl.errors import RoutingError
from tests.rl.hf_models import hybrid_spec
from rl.trainer import TrainerSettings, rollout_batch, sample_responses

SPEC = hybrid_spec()
SETTINGS = TrainerSettings(mode="grpo", actor_lr=1e-3)
CAP = 40  # tokens per micro-batch: the 6 samples make several micro-batches


def pipeline_step(model, batch) -> dict:
    """Log-probs (no grad), then one PPO-clip step through the schedule; this stage's results."""
    from rl.losses import ppo_clip_loss, reduction_weights
    from rl.trainer import pipeline as pl
    from rl.trainer import rank_forward as rf
    from rl.trainer.grads import reduce_clip_step
    from rl.trainer.optim import build_optimizer
    from rl.trainer.packing import pack_to_ranks, plan_micro_batches

    lengths = batch.num_tokens_B.tolist()
    plan = plan_micro_batches(pack_to_ranks(lengths, 1), lengths, CAP)[0]
    assert len(plan) > 2
    parts: dict = {}
    model.eval()
    with torch.no_grad():
        pl.forward_only(model, len(plan), lambda i: rf.actor_logprobs(model, batch, plan[i], replay=True),
                        lambda i: pl.stage_input_shape(model, plan[i]), lambda i, lp: rf.collect(plan[i], lp, parts))
    old = rf.gather_samples(parts, tuple(batch.tokens_BT.shape), None) if model.post_process else None
    weights = reduction_weights(batch.loss_mask_BT, "token_mean")
    adv = (batch.rewards_B - batch.rewards_B.mean())[:, None].expand(batch.loss_mask_BT.shape)
    optimizer = build_optimizer(model, SETTINGS.actor_lr, SETTINGS)
    losses = []

    def loss(i, lp):
        mb = plan[i]
        loss_bT, _ = ppo_clip_loss(lp, rf.slice_rows(old, mb).detach() - 0.05, rf.slice_rows(adv, mb),
                                   rf.slice_rows(batch.loss_mask_BT, mb, fill=False))
        out = (loss_bT * rf.slice_rows(weights, mb)).sum()
        losses.append(float(out.detach()))
        return out

    model.train()
    pl.one_f_one_b(model, len(plan), lambda i: rf.actor_logprobs(model, batch, plan[i], replay=True),
                   lambda i: pl.stage_input_shape(model, plan[i]), loss)
    norm = reduce_clip_step(model, optimizer, SETTINGS.grad_clip)
    return {"logprobs": old, "loss": sum(losses), "norm": norm}


def _batch():
    sampler = rmodel.build_policy(SPEC, seed=7, dtype=torch.bfloat16)
    seqs = sample_responses(sampler, [[1, 2, 3, 4]] * 6, 12, generator=torch.Generator().manual_seed(0))
    seqs = [s[: 8 + (i % 4) * 2] for i, s in enumerate(seqs)]
    return rollout_batch(sampler, seqs, [4] * 6, [0.1 * i for i in range(6)], [i // 2 for i in range(6)],
                         [i // 2 for i in range(6)])


def _rank(rank: int, init: str, state: dict, batch, out_dir: str) -> None:
    torch.set_num_threads(1)
    from datetime import timedelta

    from rl.megatron_cpu import init_model_parallel
    from rl.trainer import pipeline as pl

    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                                         timeout=timedelta(seconds=300))
    init_model_parallel(pp=2, timeout_s=300)
    model = rmodel.build_policy(SPEC, seed=0)
    rmodel.load_state(model, pl.stage_state(state, model))
    out = pipeline_step(model, batch)
    pieces = [None, None] if rank == 0 else None
    torch.distributed.gather_object(pl.global_names(rmodel.weights_state_dict(model), model), pieces, dst=0)
    out["actor"] = {k: v for p in pieces for k, v in p.items()} if pieces else None
    out["layers"] = model.t1_layers
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def results():
    import torch.multiprocessing as mp

    model = rmodel.build_policy(SPEC, seed=0)
    state = {k: v.clone() for k, v in rmodel.weights_state_dict(model).items()}
    batch = _batch()
    ref = pipeline_step(model, batch)
    ref["actor"] = rmodel.weights_state_dict(model)
    out_dir = tempfile.mkdtemp(prefix="t1ops-pp-")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, f"file://{out_dir}/rendezvous", state, batch, out_dir), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    assert [p.exitcode for p in procs] == [0, 0]
    return batch, ref, [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(2)]


@pytest.mark.heavy  # two stage processes at the model level; the trainer's pp = 2 step is in the default run (test_trainer_ranks.py[pp2])
def test_pp2_matches_one_rank(results):
    batch, ref, (stage0, stage1) = results
    assert stage0["layers"] == (0, 2) and stage1["layers"] == (2, 2)
    lp = float((stage1["logprobs"] - ref["logprobs"])[batch.loss_mask_BT].abs().max())
    w = max(float((stage0["actor"][k] - v).abs().max()) for k, v in ref["actor"].items())
    print(f"\npp=2 vs 1 rank (qwen3_5_moe, 4 layers, 1F1B over micro-batches, R3): log-probs max |diff| {lp:.3e}; "
          f"loss {stage1['loss']:.8f} vs {ref['loss']:.8f}; grad norm {stage0['norm']:.8f} vs {ref['norm']:.8f}; "
          f"weights after the step max |diff| {w:.3e}")
    assert lp <= 1e-6
    assert stage1["loss"] == pytest.approx(ref["loss"], rel=1e-6, abs=1e-8)
    assert stage0["norm"] == pytest.approx(ref["norm"], rel=1e-6) and stage1["norm"] == stage0["norm"]
    assert set(stage0["actor"]) == set(ref["actor"])
    assert w <= 1e-6


def test_stage_rows_are_the_stage_layers():
    """A stage replays its own layers' columns, one row per token; another count fails per sample."""
    import numpy as np

    from rl.trainer.pipeline import stage_rows

    class Stage:
        t1_layers, t1_spec = (2, 2), SPEC

    rows = [np.arange(5 * 4 * 2).reshape(5, 4, 2)]
    assert np.array_equal(stage_rows(rows, 5, Stage, ["s0"])[0], rows[0][:, 2:4])
    with pytest.raises(RoutingError, match="sample s0 at pipeline stage .*: 4 routing rows for 5 tokens"):
        stage_rows([rows[0][1:]], 5, Stage, ["s0"])
    with pytest.raises(RoutingError, match="sample s0 at pipeline stage .*: rows hold 3 layers, the model 4"):
        stage_rows([rows[0][:, :3]], 5, Stage, ["s0"])
