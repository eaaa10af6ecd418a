"""`t1ops chaos verify-recovery` (chaos/recovery.py, docs/determinism.md): the tiny campaign in its
deterministic configuration, 4 steps, once clean and once with each fault plus its recovery (an
engine SIGKILLed mid-rollout; the coordinator SIGKILLed and resumed; the trainer's rank SIGKILLed
and the run resumed): per-step rewards and losses and the final actor checksum are identical.

The check can fail: without the per-request seed (``rollout.seed_requests = false``) a fault run
differs from the clean one (tests/rl/test_batch_invariant.py shows the engine-level seam in
seconds; the campaign-level failure is recorded in docs/determinism.md)."""
from __future__ import annotations

import pytest

from chaos.critic_skip import skip_critic_saves
from chaos.recovery import FAULTS, Record, differences, verify


def test_differences_names_every_figure_and_the_checksum():
    clean = Record("clean", steps=[{"step": 1, "reward_mean": 0.5, "policy_loss": 0.1, "value_loss": 0.2}],
                   checksum="step_1:aa")
    same = Record("x", steps=[dict(clean.steps[0])], checksum="step_1:aa")
    assert differences(clean, same) == []
    off = Record("y", steps=[{**clean.steps[0], "policy_loss": 0.1 + 1e-12}], checksum="step_1:ab")
    got = differences(clean, off)
    assert any("policy_loss" in d for d in got) and any("final actor" in d for d in got)
    assert differences(clean, Record("z")) != []  # a run that recorded nothing never passes


@pytest.mark.chaos
@pytest.mark.slow
def test_every_fault_plus_recovery_equals_the_clean_run(tmp_path):
    """All three faults in one run (engine-kill at step 2, coordinator-kill at 3 and trainer-kill at 4,
    each crash resumed): two campaigns instead of four, every recovery path on the way."""
    ok, records, text = verify(tmp_path, FAULTS, combined=True)
    assert len(records) == 2 and records[1].fired.count("SIGKILL") == 3, text
    assert ok, text
    assert records[0].evals == records[1].evals == [0, 2, 4], text  # eval across both resumes


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.heavy  # two more campaigns (~600 s of a 2-core host); the resume path is the combined run's above,
# the guard's catch is the critic-checkpoint-skipped scenario's (default run); docs/testing.md "Heavy tests"
def test_a_skipped_critic_save_plus_resume_equals_the_clean_run(tmp_path):
    """critic-checkpoint-skipped's recovery is a sync-mode resume: the trainer skips the critic's save
    from step 3 on (chaos.critic_skip), the check after the save stops the run there, and the run
    resumed from step 2 ends with the clean run's figures and actor, bit for bit."""
    ok, records, text = verify(tmp_path, ("critic-skip",))
    assert len(records) == 2 and "CheckpointError at that step" in records[1].fired, text
    assert records[1].rcs[0] not in (0, None), text   # the first process stopped on the check
    assert ok, text


def test_the_critic_skip_fault_skips_only_the_critics_saves_from_its_step(tmp_path):
    from types import SimpleNamespace

    import torch

    from t1ops.guards.checkpoints import CheckpointManager, list_steps

    host = SimpleNamespace(ckpt=CheckpointManager.from_base(tmp_path, save_every=1), rank=0)
    state = {"w": torch.zeros(2)}
    host.ckpt.save("critic", 2, state)
    assert skip_critic_saves(host, 3) == 0
    for step in (3, 4):
        host.ckpt.save("actor", step, state)
        host.ckpt.save("critic", step, state)
    assert list_steps(tmp_path / "actor") == [3, 4] and list_steps(tmp_path / "critic") == [2]


def test_cli_refuses_an_unknown_fault(capsys):
    from t1ops.cli import main

    assert main(["chaos", "verify-recovery", "--faults", "engine-kill,disk-full"]) == 2
    assert "unknown fault(s): disk-full" in capsys.readouterr().err


def test_cli_refuses_critic_skip_combined(capsys):
    from t1ops.cli import main

    assert main(["chaos", "verify-recovery", "--faults", "engine-kill,critic-skip", "--combined"]) == 2
    assert "run critic-skip without --combined" in capsys.readouterr().err
