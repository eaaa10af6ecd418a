"""The typed trial results (t1ops.campaign.trials) and the typed worker settings: what crosses Ray
between the worker, the coordinator and the trainer."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from rl.tito import Trajectory
from t1ops.campaign.trials import BatchResult, GroupResult, TrialResult
from tests.t1ops.results import group


def _chunk(n: int = 6) -> Trajectory:
    mask = np.r_[np.zeros(n // 2, np.int8), np.ones(n - n // 2, np.int8)]
    return Trajectory(tokens=np.arange(n, dtype=np.int64), loss_mask=mask,
                      rollout_logprobs=np.full(n, -0.5, np.float32), engine_tokens=np.arange(n, dtype=np.int64),
                      origin=np.zeros(n, np.int8), policy_version=np.where(mask == 1, 2, -1).astype(np.int32),
                      routing=np.ones((n, 2, 2), np.int32), meta={"sample_id": "g-s1"})


def test_results_round_trip_through_pickle_with_every_field():
    r = TrialResult(task="t", group_id="g", sample_id="g-s1", reward=0.25, trial_id="tr-1", family="f",
                    reward_source="ctrf", solved=False, passed=1, total=4, num_turns=3, end_reason="done",
                    commands=["ls"], tamper=[{"kind": "write"}], failed=False, queue_s=0.5, trial_s=2.0,
                    harness={"parse_failures": 1}, loss_versions={2: 3}, chunks=[_chunk()])
    back = pickle.loads(pickle.dumps(r))
    assert type(back) is TrialResult and back.sample_idx == 1 and not back.staged
    c, b = r.chunks[0], back.chunks[0]
    assert all(np.array_equal(getattr(c, a), getattr(b, a)) for a in ("tokens", "loss_mask", "routing"))
    assert back.replace(chunks=None) == r.replace(chunks=None)  # every other field as it was
    g = group("ag3-t", [0.0, 1.0], started_step=2)
    assert pickle.loads(pickle.dumps(g)) == g and isinstance(g.results[0], TrialResult)
    out = BatchResult(results=[r.replace(chunks=None)], ledger={"expected": 1}, failed={}, node="n")
    assert pickle.loads(pickle.dumps(out)) == out
    with pytest.raises(AttributeError):  # frozen: a result is never edited in place, only replaced
        r.reward = 1.0
    assert isinstance(g, GroupResult)


def test_a_dict_shaped_result_is_refused_by_name_at_the_trainer_boundary():
    from t1ops.campaign.credit import assign_credit
    from t1ops.campaign.reward_policy import RewardPolicy

    old = {"sample_id": "g-s0", "group_id": "g", "task": "t", "reward": 1.0, "chunks": [_chunk()]}
    with pytest.raises(TypeError, match=r"credit.assign_credit takes t1ops.campaign.trials.TrialResult.*"
                                        r"got a dict with keys \['chunks', 'group_id'"):
        assign_credit([old], RewardPolicy())
    ok = TrialResult(task="t", group_id="g", sample_id="g-s0", reward=1.0, chunks=[_chunk()])
    assert assign_credit([ok], RewardPolicy()).trials == (ok,)


def test_worker_settings_carry_the_config_sections_as_declared():
    from t1ops.campaign.launch import _worker_settings
    from t1ops.config import parse_config

    cfg = parse_config({"run": {"seed": 5}, "rollout": {"max_concurrency": 3, "failed_trials": "zero"},
                        "environment": {"backend": "local"}, "sandbox": {"memory_mb": 512},
                        "guards": {"field": {"verifier_timeout_cap_s": 30.0}}})
    s = _worker_settings(cfg)
    # the sections themselves, not field-by-field copies: a new [rollout] key reaches the worker as is
    assert s.rollout is cfg.rollout and s.sandbox is cfg.sandbox and s.field_guards is cfg.guards.field
    assert s.seed == 5 and s.sandbox_fields()["memory_mb"] == 512 and s.sandbox_fields()["backend"] == "local"
    assert s.agent.max_turns == cfg.rollout.max_turns  # the agent's limits derive from rollout's AgentLimits
    back = pickle.loads(pickle.dumps(s))  # Ray sends them to every worker
    assert back.rollout == cfg.rollout and back.agent == s.agent
    unseeded = _worker_settings(parse_config({"rollout": {"seed_requests": False}}))
    assert unseeded.seed is None


def test_the_rollout_side_of_the_results_never_imports_torch():
    """The worker, its group and eval runners and the result types load without torch (a rollout
    worker never imports it: rl/length_shaping.py); the trainer side that reads them does."""
    import subprocess
    import sys

    code = ("import sys, t1ops.campaign.trials, t1ops.campaign.worker, t1ops.campaign.async_worker, "
            "t1ops.campaign.evaluation, t1ops.campaign.dataplane; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_the_engine_router_never_imports_torch():
    """The router actor only starts engine processes and routes requests: loading the model's
    libraries there would cost every campaign about 1.7 CPU-s for nothing (docs/testing.md)."""
    import subprocess
    import sys

    code = "import sys, t1ops.campaign.engines; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
