"""Rank-actor helpers that need no Ray: rank 0's answer with every rank's timing; two rank hosts that
save by shard and resume their own shard."""
from t1ops.campaign.rank_combine import Combiner

_combine = Combiner().combine  # the combiner actor's method, called in process


def test_train_answer_is_rank_zeros_with_every_ranks_timing():
    from t1ops.campaign.roles import RankInfo, TrainReport

    info = [RankInfo(rank=r, dp_rank=r, train_s=0.1, micro_batches=1, staged=0, fetched=[], fetched_bytes=0,
                     light_bytes=0) for r in (0, 1)]
    out = _combine("train", TrainReport(stats="rank0", rank_info=info[0]), TrainReport(stats="rank1", rank_info=info[1]))
    assert out.stats == "rank0" and [r.rank for r in out.ranks] == [0, 1] and out.rank_info is None
    assert _combine("publish", "/ckpt/step_1", None) == "/ckpt/step_1"


def _rank_host(rank: int, init_method: str, run_dir: str, vocab_path: str, examples, out) -> None:
    import torch

    torch.set_num_threads(1)
    from t1ops.campaign.trainer_host import TrainerHost
    from rl.trainer.ranks import Layout
    from t1ops.config import CampaignConfig, CheckpointsConfig

    cfg = CampaignConfig()
    spec = {**cfg.model.model_spec().to_dict(), "num_layers": 1, "hidden_size": 32, "ffn_hidden_size": 64,
            "moe_ffn_hidden_size": 32, "max_seq_len": 1024}
    host = TrainerHost(rank=rank, layout=Layout(dp=2, max_tokens_per_gpu=2048), spec=spec,
                           settings=cfg.trainer.model_copy(update={"save_every": 1}),
                           vocab_path=vocab_path, ckpt_base=f"{run_dir}/checkpoints", seed=0, run_dir=run_dir,
                           guards=cfg.guards, retention=CheckpointsConfig.model_construct(keep_last=1, keep_every=0))
    host.join(init_method)
    losses = host.warm_start(examples, 2, batch_size=4)
    paths = [host.publish(v) for v in (0, 1)]
    report = host.checkpoint_report()
    saved = {k: v.clone() for k, v in host.trainer.actor.state_dict().items() if isinstance(v, torch.Tensor)}
    host.warm_start(examples, 1, batch_size=4)  # moves weights and optimizer state past step 1 ...
    loaded = host.resume(1)  # ... and a resume at step 1 brings back this rank's own state
    from t1ops.campaign.resume import load_trainer_state

    state = load_trainer_state(f"{run_dir}/checkpoints", 1)
    want = state["ranks"][rank]["actor_optimizer"]["state"]
    got = host.trainer.actor_optimizer.state_dict()["state"]
    restored = (len(state["ranks"]) == 2 and want.keys() == got.keys()
                and all(torch.equal(want[k]["exp_avg"], got[k]["exp_avg"]) for k in want)
                and all(torch.equal(v, host.trainer.actor.state_dict()[k]) for k, v in saved.items()))
    out.put((rank, losses, paths, report, restored, loaded["next_step"], loaded["loaded"]))


def test_rank_hosts_warm_start_publish_and_save_sharded(tmp_path):
    """Two ranks of the one trainer class (what the campaign runs as Ray actors), without Ray."""
    import torch.multiprocessing as mp

    from rl.agent.tasks import load_pool
    from rl.chat import ChatRenderer
    from t1ops.campaign.launch import build_vocab, warm_start_examples
    from t1ops.guards.rendezvous import plan_rendezvous
    from t1ops.guards.sharded_checkpoints import load_role, shard_dir

    tasks = load_pool(str(__import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "tasks"))
    vocab = build_vocab(tasks, ChatRenderer.default(), 248_320, multiple=2)
    assert vocab.size % 2 == 0  # padded for tp = 2
    vocab.save(tmp_path / "vocab.json")
    examples = warm_start_examples(tasks, 0.5, 0)[:8]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    init = plan_rendezvous("127.0.0.1")  # a fresh port per attempt (a single free_port() can be taken first)
    procs = [ctx.Process(target=_rank_host, args=(r, init, str(tmp_path), str(tmp_path / "vocab.json"), examples,
                                                  out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0]
    got = dict((r, rest) for r, *rest in (out.get() for _ in procs))
    assert got[0][0] == got[1][0]  # both ranks report the same (all-reduced) warm-start losses
    assert got[0][1][1].endswith("step_00000001") and got[1][1] == [None, None]  # rank 0 publishes
    assert got[0][2].checkpoints_deleted >= 1  # keep_last = 1 pruned step 0 (full and sharded)
    assert got[0][2].resume_point == 1  # every rank's optimizer state is in trainer_state/step_1
    own = {"actor": "own shard", "critic": "own shard", "trainer_state": "own state"}  # same layout: its own files
    assert got[0][3:] == [True, 2, own] and got[1][3:] == [True, 2, own]  # each rank resumed its own state
    for role in ("actor", "critic"):  # saved by shard in the role's directory: no gathered weights.pt
        step_dir = shard_dir(tmp_path / "checkpoints", role, 1)
        full, manifest = load_role(step_dir, role)
        assert len(manifest["shards"]) == 2 and not (step_dir / "weights.pt").exists()
        assert manifest["layout"]["dp"] == 2 and not shard_dir(tmp_path / "checkpoints", role, 0).exists()
    state_dir = tmp_path / "checkpoints" / "trainer_state" / "step_00000001"  # optimizer + RNG: a file per rank
    ranks = __import__("json").loads((state_dir / "manifest.json").read_text())["ranks"]
    assert [e["rank"] for e in ranks] == [0, 1] and all((state_dir / e["file"]).is_file() for e in ranks)


def test_a_skipped_step_combines_to_no_rank_info():
    """A batch with no signal is skipped on every rank (no RankInfo): the row gets no ranks, not Nones
    (a fully_async dp = 2 walkthrough run crashed on this before the fix)."""
    from t1ops.campaign.roles import TrainReport

    out = _combine("train", TrainReport(skipped="no signal"), TrainReport(skipped="no signal"))
    assert out.skipped == "no signal" and out.ranks == []
