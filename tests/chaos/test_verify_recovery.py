"""`t1ops chaos verify-recovery` (chaos/recovery.py, docs/determinism.md): the tiny campaign in its
deterministic configuration, 4 steps, once clean and once with each fault plus its recovery (an
engine SIGKILLed mid-rollout; the coordinator SIGKILLed and resumed; the trainer's rank SIGKILLed
and the run resumed): per-step rewards and losses and the final actor checksum are identical.

The check can fail: without the per-request seed (``rollout.seed_requests = false``) a fault run
differs from the clean one (tests/rl/test_batch_invariant.py shows the engine-level seam in
seconds; the campaign-level failure is recorded in docs/determinism.md)."""
from __future__ import annotations

import pytest

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


def test_cli_refuses_an_unknown_fault(capsys):
    from t1ops.cli import main

    assert main(["chaos", "verify-recovery", "--faults", "engine-kill,disk-full"]) == 2
    assert "unknown fault(s): disk-full" in capsys.readouterr().err
