"""Rank-actor helpers that need no Ray: retention of sharded steps, rank 0's answer with every rank's timing."""
from t1ops.campaign.rank_actors import _combine, _prune
from t1ops.campaign.retention import Retention


def test_retention_prunes_sharded_steps(tmp_path):
    role_dir = tmp_path / "critic-shards"
    for step in (0, 4, 8, 12):
        (role_dir / f"step_{step:08d}").mkdir(parents=True)
    keep = Retention(tmp_path, needs_critic=True, keep_last=2).keep
    assert _prune(role_dir, keep) == ["critic-shards/step_00000000", "critic-shards/step_00000004"]
    assert sorted(p.name for p in role_dir.iterdir()) == ["step_00000008", "step_00000012"]


def test_train_answer_is_rank_zeros_with_every_ranks_timing():
    out = _combine("train", {"loss": 1.0, "rank_info": {"rank": 0}}, {"loss": 1.0, "rank_info": {"rank": 1}})
    assert out["loss"] == 1.0 and [r["rank"] for r in out["ranks"]] == [0, 1]
    assert _combine("publish", "/ckpt/step_1", None) == "/ckpt/step_1"
