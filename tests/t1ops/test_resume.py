"""Resume planning, trainer state, superseding, config check; checkpoint retention."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from t1ops.campaign.resume import (check_same_campaign, load_trainer_state, plan_resume, rng_state,
                                   save_trainer_state, set_rng_state, supersede_after)
from t1ops.campaign.retention import Retention, disk_bytes
from t1ops.config import CampaignConfig
from t1ops.errors import CheckpointError, ConfigError
from t1ops.guards.checkpoints import CheckpointManager, list_steps

W = {"w": torch.ones(2, 2)}


def _run(tmp_path: Path, actor, critic, state) -> Path:
    base = tmp_path / "checkpoints"
    ckpt = CheckpointManager.from_base(base)
    for s in actor:
        ckpt.save("actor", s, W)
    for s in critic:
        ckpt.save("critic", s, W)
    for s in state:
        save_trainer_state(base, s, {"step": s, "next_step": s + 1})
    return base


def test_resume_picks_the_newest_common_step_and_says_the_roles_disagree(tmp_path):
    base = _run(tmp_path, actor=range(0, 8), critic=[0, 4], state=[0, 4])
    point = plan_resume(base, needs_critic=True)
    assert point.step == 4
    assert "actor 7, critic 4" in point.message and "roles disagree" in point.message
    assert plan_resume(base, needs_critic=False).step == 4  # GRPO: the trainer state still bounds it


def test_resume_skips_a_corrupt_step_and_names_it(tmp_path):
    base = _run(tmp_path, actor=[0, 4], critic=[0, 4], state=[0, 4])
    (base / "critic" / "step_00000004" / "weights.pt").write_bytes(b"torn")
    point = plan_resume(base, needs_critic=True)
    assert point.step == 0 and 4 in point.skipped and "skipped step 4" in point.message
    (base / "trainer_state" / "step_00000000" / "state.pt").write_bytes(b"torn")
    with pytest.raises(CheckpointError, match="nothing to resume"):
        plan_resume(base, needs_critic=True)


def test_resume_config_must_be_the_same_campaign():
    cfg = CampaignConfig().model_dump()
    longer = json.loads(json.dumps(cfg))
    longer["run"]["steps"] = 50
    longer["eval"]["every_steps"] = 3
    check_same_campaign(cfg, longer)
    other = json.loads(json.dumps(cfg))
    other["trainer"]["actor_lr"] = 0.5
    with pytest.raises(ConfigError, match="trainer.actor_lr"):
        check_same_campaign(cfg, other)


def test_resume_supersedes_what_came_after_the_resume_step(tmp_path):
    base = _run(tmp_path, actor=[0, 1, 2, 3], critic=[0, 2], state=[0, 2])
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for name in ("st2-g0-a-s0.c0.npz", "st3-g0-a-s0.c0.npz", "st12-g0-a-s0.c0.npz"):
        (dumps / name).write_bytes(b"x")
    dest = supersede_after(tmp_path, 2)
    assert list_steps(base / "actor") == [0, 1, 2] and list_steps(dest / "checkpoints" / "actor") == [3]
    assert sorted(p.name for p in dumps.iterdir()) == ["st2-g0-a-s0.c0.npz"]
    assert len(list((dest / "dumps").iterdir())) == 2  # moved, never deleted
    assert supersede_after(tmp_path, 2) is None


def test_resume_trainer_state_restores_optimizer_and_rng(tmp_path):
    """A trainer rebuilt from weights + trainer state takes the same next step as the original."""
    from rl.model import weights_state_dict
    from rl.trainer import Trainer, TrainerSettings
    from tests.rl.test_ppo_numerics import SPEC, _batch

    torch.set_num_threads(1)
    s = TrainerSettings(mode="ppo", actor_lr=1e-2)
    a = Trainer(SPEC, s, seed=0)
    b1, b2 = _batch(a.actor, seed=1), _batch(a.actor, seed=2)
    a.train_step(b1)
    save_trainer_state(tmp_path, 1, {"step": a.step, "rng": rng_state(),
                                     "actor_optimizer": a.actor_optimizer.state_dict(),
                                     "critic_optimizer": a.critic_optimizer.state_dict()})
    actor_w, critic_w = ({k: v.clone() for k, v in weights_state_dict(m).items()} for m in (a.actor, a.critic))
    expected = torch.rand(3)
    a.train_step(b2)
    b = Trainer(SPEC, s, seed=5)
    st = load_trainer_state(tmp_path, 1)
    b.load_weights(actor_w, critic_w, st["step"])
    b.actor_optimizer.load_state_dict(st["actor_optimizer"])
    b.critic_optimizer.load_state_dict(st["critic_optimizer"])
    set_rng_state(st["rng"])
    assert torch.equal(torch.rand(3), expected)  # RNG restored
    b.train_step(b2)
    for k, v in weights_state_dict(a.actor).items():
        assert torch.equal(v, weights_state_dict(b.actor)[k]), k  # Adam moments restored, not fresh
    fresh = Trainer(SPEC, s, seed=5)
    fresh.load_weights(actor_w, critic_w, 1)
    fresh.train_step(b2)
    assert any(not torch.equal(v, weights_state_dict(fresh.actor)[k]) for k, v in weights_state_dict(a.actor).items())


def test_retention_keeps_last_n_every_k_and_the_resume_point(tmp_path):
    base = _run(tmp_path, actor=range(0, 12), critic=[0, 4, 8], state=[0, 4, 8])
    (base / "actor" / ".deleting-step_00000099").mkdir()  # an interrupted deletion
    before = disk_bytes(base)
    deleted = Retention(base, keep_last=2, keep_every=5).apply()
    assert list_steps(base / "actor") == [0, 5, 8, 10, 11]  # 10, 11 last; 0, 5, 10 every 5th; 8 resume point
    assert list_steps(base / "critic") == [0, 4, 8] and list_steps(base / "trainer_state") == [0, 4, 8]
    assert not (base / "actor" / ".deleting-step_00000099").exists()
    assert "actor/step_00000001" in deleted and disk_bytes(base) < before
    plan_resume(base, needs_critic=True)  # still resumable


def test_retention_never_deletes_the_resume_point_even_when_old(tmp_path):
    base = _run(tmp_path, actor=range(0, 10), critic=[2], state=[2])
    Retention(base, keep_last=2).apply()
    assert list_steps(base / "actor") == [2, 8, 9] and plan_resume(base, needs_critic=True).step == 2


def test_trainer_host_publish_saves_resume_state_retains_and_resumes(tmp_path):
    """The trainer role end to end without Ray: publish writes what a resume needs, retention
    prunes, a second host resumes the verified step with the same weights and optimizer state."""
    from rl.trainer.trainer import copy_state
    from rl.vocab import CompactVocab
    from t1ops.campaign.trainer_host import TrainerHost
    from t1ops.config import CampaignConfig, CheckpointsConfig

    cfg = CampaignConfig()
    vocab = CompactVocab(range(300), 248_320, has_unk=True)
    vocab.save(tmp_path / "vocab.json")
    spec = {**cfg.model.model_spec().to_dict(), "hidden_size": 32, "ffn_hidden_size": 64, "moe_ffn_hidden_size": 32,
            "max_seq_len": 128}
    settings = cfg.trainer.model_copy(update={"save_every": 2})
    kw = dict(spec=spec, settings=settings, vocab_path=str(tmp_path / "vocab.json"), ckpt_base=str(tmp_path / "ck"),
              seed=0, retention=CheckpointsConfig(keep_last=2, keep_every=0))
    host = TrainerHost(**kw)
    for v in range(0, 6):
        host.publish(v)
        if v == 2:  # Adam moments exist from here on
            for p in host.trainer.actor.parameters():
                p.grad = torch.ones_like(p)
            host.trainer.actor_optimizer.step()
            host.trainer.actor_optimizer.zero_grad()
    report = host.checkpoint_report()
    assert report.resume_point == 4 and report.checkpoint_bytes > 0
    base = tmp_path / "ck"
    # the full checkpoint is written at save_every only (steps 0, 2, 4; keep_last = 2), not on every publish
    assert list_steps(base / "actor") == list_steps(base / "critic") == list_steps(base / "trainer_state") == [2, 4]
    assert host.published.keys() == {4, 5}  # ... while every publish keeps the engines' weights
    assert host.publish(6, final=True).endswith("step_00000006")  # the run's last step is a resume point
    assert list_steps(base / "actor") == list_steps(base / "trainer_state") == [4, 6]
    point = plan_resume(base, needs_critic=True)
    assert point.step == 6 and "roles disagree" not in point.message
    other = TrainerHost(**{**kw, "seed": 9})
    loaded = other.resume(point.step)
    assert loaded["next_step"] == 7 and set(other.published) == {6}
    want = load_trainer_state(base, 6)["ranks"][0]["actor_optimizer"]["state"]  # one rank: one entry
    got = other.trainer.actor_optimizer.state_dict()["state"]
    assert want.keys() == got.keys() and all(torch.equal(want[k]["exp_avg"], got[k]["exp_avg"]) for k in want)
    from rl.model import weights_state_dict
    saved = host.ckpt.load("actor", 6)
    assert all(torch.equal(v, saved[k]) for k, v in weights_state_dict(other.trainer.actor).items())


def test_open_for_resume_refusals_and_summary_carry_over(tmp_path):
    from t1ops.campaign.resume import open_for_resume, resumed_summary
    from t1ops.campaign.summary import Summary

    cfg = CampaignConfig()
    cfg.run.steps = 6
    with pytest.raises(ConfigError, match="config.json does not exist"):
        open_for_resume(tmp_path, cfg)
    (tmp_path / "config.json").write_text(cfg.model_dump_json())
    _run(tmp_path, actor=[0, 1, 2, 3], critic=[0, 2], state=[0, 2])
    rows = [{"step": s, "reward_mean": 0.1 * s} for s in (1, 2, 3)]
    (tmp_path / "summary.json").write_text(json.dumps({"steps": rows, "eval": [{"step": 0}, {"step": 3}],
                                                       "warm_start_loss": [3.0, 1.0]}))
    short = cfg.model_copy(deep=True)
    short.run.steps = 2
    with pytest.raises(ConfigError, match="already holds step 2"):
        open_for_resume(tmp_path, short)
    run, point, previous = open_for_resume(tmp_path, cfg)
    assert run.path == tmp_path.resolve() and point.step == 2
    s = Summary(run.path, run.run_id, {})
    resumed_summary(s, previous, point)
    data = json.loads((tmp_path / "summary.json").read_text())
    assert [r["step"] for r in data["steps"]] == [1, 2] and [e["step"] for e in data["eval"]] == [0]
    assert data["resumes"][0]["from_step"] == 2 and data["resumes"][0]["steps_run_again"] == [3]
    assert data["warm_start_loss"] == [3.0, 1.0]
    assert json.loads((Path(data["resumes"][0]["superseded"]) / "summary-steps.json").read_text())[0]["step"] == 3


def test_a_key_added_to_the_schema_after_the_run_counts_as_its_default():
    from t1ops.config import parse_config

    cfg = json.loads(parse_config({}).model_dump_json())
    old = json.loads(json.dumps(cfg))
    for key in ("lr_warmup_steps", "lr_schedule", "mini_batches"):  # a run from before these keys (issue 55)
        del old["trainer"][key]
    check_same_campaign(old, cfg)
    cfg["trainer"]["mini_batches"] = 2
    with pytest.raises(ConfigError, match="trainer.mini_batches"):
        check_same_campaign(old, cfg)


def test_trainer_state_by_rank_reads_only_its_own_file_and_verifies_every_one(tmp_path):
    """A multi-rank trainer writes each rank's optimizer and RNG state in its own file (nothing gathered);
    rank 0 moves them into the step; a rank reads back only its own; a corrupt rank file is refused."""
    from t1ops.campaign.resume import save_rank_state

    class Rank:
        actor_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
        critic_optimizer = None

    entries = [save_rank_state(tmp_path, 2, r, Rank) for r in (0, 1)]
    save_trainer_state(tmp_path, 2, {"step": 2, "next_step": 3, "ranks": None}, entries)
    mine = load_trainer_state(tmp_path, 2, rank=1)
    assert mine["ranks"][0] is None and mine["ranks"][1]["actor_optimizer"]["param_groups"][0]["lr"] == 0.1
    assert not (tmp_path / "trainer_state" / ".partial-ranks" / entries[0]["file"]).exists()  # moved in
    rank_file = tmp_path / "trainer_state" / "step_00000002" / entries[0]["file"]
    rank_file.write_bytes(rank_file.read_bytes()[:-3])
    with pytest.raises(CheckpointError, match="differs from its manifest"):
        load_trainer_state(tmp_path, 2, rank=1)  # every rank's file is verified, not only the one read
