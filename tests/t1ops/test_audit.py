"""`t1ops audit`: dump round trip, totals against direct computation, CLI, bad dumps."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.errors import ParseError
from rl.tito import PLACEHOLDER, RETOKENIZED, Trajectory
from t1ops.audit import audit_dump, read_trajectory, write_trajectory
from t1ops.cli import main


def make_traj(seed: int, sample: str, chunk: int = 0, relations=("strict",), routing=True,
              drift: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 50))
    tokens = rng.integers(0, 1000, n)
    mask = (rng.random(n) < 0.5).astype(np.int8)
    origin = rng.choice([0, 0, 0, RETOKENIZED, PLACEHOLDER], n).astype(np.int8)
    engine = tokens.copy()
    loss = np.flatnonzero(mask)
    engine[loss[:drift]] += 1
    return Trajectory(tokens=tokens, loss_mask=mask,
                      rollout_logprobs=np.where(mask == 1, -0.5, 0).astype(np.float32),
                      engine_tokens=engine, origin=origin,
                      policy_version=np.where(mask == 1, 3, -1).astype(np.int32),
                      routing=rng.integers(0, 8, (n, 2, 2)).astype(np.int32) if routing else None,
                      meta={"sample_id": sample, "chunk_id": chunk, "relations": list(relations)})


def test_round_trip(tmp_path):
    t = make_traj(1, "s0")
    back = read_trajectory(write_trajectory(t, tmp_path, reward=1.0, reward_source="ctrf"))
    for key in ("tokens", "loss_mask", "rollout_logprobs", "engine_tokens", "origin",
                "policy_version", "routing"):
        assert np.array_equal(getattr(back, key), getattr(t, key)), key
    assert back.meta["reward"] == 1.0 and back.meta["sample_id"] == "s0"
    no_r3 = read_trajectory(write_trajectory(make_traj(2, "s1", routing=False), tmp_path))
    assert no_r3.routing is None


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.lists(st.sampled_from(
    ["strict", "normalized", "retokenized", "split"]), min_size=1, max_size=4)), min_size=1, max_size=6))
def test_totals_match_direct_computation(tmp_path_factory, specs):
    d = tmp_path_factory.mktemp("dump")
    trajs = [make_traj(seed, f"s{i}", relations=rels) for i, (seed, rels) in enumerate(specs)]
    for t in trajs:
        write_trajectory(t, d)
    rep = audit_dump(d).to_dict()
    pos = sum(len(t) for t in trajs)
    assert rep["samples"] == len(trajs) and rep["positions"] == pos
    assert rep["aligned"] == sum(int((t.origin == 0).sum()) for t in trajs)
    assert rep["retokenized_pct"] == pytest.approx(
        100 * sum(int((t.origin == RETOKENIZED).sum()) for t in trajs) / pos)
    assert rep["routing_rows"] == pos and rep["drift_in_loss"] == 0
    assert rep["all_strict_samples"] == sum(set(r) == {"strict"} for _, r in specs)
    for rel in ("strict", "split"):
        assert rep["relations"][rel] == sum(r.count(rel) for _, r in specs)


def test_all_strict_is_a_conjunction_over_chunks(tmp_path):
    write_trajectory(make_traj(1, "a", 0, ["strict"]), tmp_path)
    write_trajectory(make_traj(2, "a", 1, ["split", "strict"]), tmp_path)
    write_trajectory(make_traj(3, "b", 0, ["strict", "strict"]), tmp_path)
    rep = audit_dump(tmp_path)
    assert rep.samples == 2 and rep.files == 3 and rep.all_strict_samples == 1


def test_cli_json_and_exit_code(tmp_path, capsys):
    write_trajectory(make_traj(5, "ok"), tmp_path)
    assert main(["audit", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["drift_in_loss_pct"] == 0.0 and out["samples"] == 1
    bad = make_traj(6, "bad", drift=2)
    write_trajectory(bad, tmp_path)
    assert main(["audit", str(tmp_path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["drift_in_loss"] == 2
    assert main(["audit", str(tmp_path)]) == 1  # table form
    assert "drift inside loss region" in capsys.readouterr().out


def test_bad_dumps_are_parse_errors(tmp_path):
    with pytest.raises(ParseError, match="not a directory"):
        audit_dump(tmp_path / "nope")
    with pytest.raises(ParseError, match="no \\*.npz"):
        audit_dump(tmp_path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ParseError, match="junk.npz: not a readable trajectory dump"):
        audit_dump(tmp_path)
    (tmp_path / "junk.npz").unlink()
    np.savez(tmp_path / "short.npz", tokens=np.arange(3))
    with pytest.raises(ParseError, match="short.npz: dump file lacks"):
        audit_dump(tmp_path)
    (tmp_path / "short.npz").unlink()
    t = make_traj(7, "m")
    t.loss_mask = t.loss_mask[:-1]
    write_trajectory(t, tmp_path)
    with pytest.raises(ParseError, match="loss_mask has .* entries, tokens has"):
        audit_dump(tmp_path)
