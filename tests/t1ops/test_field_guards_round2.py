"""The round-2 field guards' own rules (their scenarios in chaos/scenarios/ prove them end to end)."""
from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from rl.agent.response import policy_version
from rl.engines.protocol import WeightVersionSpan
from t1ops.errors import CheckpointError, DataContractError, SandboxError
from t1ops.guards.infra_verdict import check_verdict, killed_by
from t1ops.guards.step_once import StepLedger


def _verdict(reason: str, exit_code: int | None):
    return SimpleNamespace(reason=reason, exit_code=exit_code, trial_id="t-0", verifier_pids=(1,), budget_s=1.0,
                           duration_s=1.0)


@pytest.mark.parametrize("code,sig", [(-9, signal.SIGKILL), (137, signal.SIGKILL), (143, signal.SIGTERM),
                                      (1, None), (0, None), (None, None), (-11, None), (139, None)])
def test_killed_by_names_only_signals_from_outside(code, sig):
    assert killed_by(code) == sig


def test_check_verdict_fails_killed_and_timed_out_verifiers_and_keeps_real_zeros():
    with pytest.raises(SandboxError, match="killed by SIGKILL"):
        check_verdict("t", _verdict("no-verdict", 137))
    with pytest.raises(Exception, match="outlived"):
        check_verdict("t", _verdict("verifier-timeout", -9))
    check_verdict("t", _verdict("no-verdict", 1))      # the verifier ran and wrote nothing: its zero stands
    check_verdict("t", _verdict("ok", -9))             # a verdict was written before the kill: it stands
    check_verdict("t", _verdict("memory_limit", 137))  # a limit the agent's solution hit: its result


def test_step_ledger_answers_a_retry_and_refuses_an_older_step():
    ledger = StepLedger()
    assert ledger.applied(1) is None
    ledger.done(1, {"loss": 1.0})
    assert ledger.applied(1) == {"loss": 1.0}
    assert ledger.applied(2) is None
    with pytest.raises(DataContractError, match="already applied step 1"):
        ledger.applied(0)


def test_policy_version_labels_from_the_token_spans_not_the_response_read():
    resp = SimpleNamespace(weight_version="2", output_ids=(1, 2, 3),
                           weight_versions=(WeightVersionSpan("1", 0, 3),))
    assert policy_version(resp) == 1
    resp.weight_versions = (WeightVersionSpan("1", 0, 1), WeightVersionSpan("2", 1, 3))
    assert policy_version(resp) == [1, 2, 2]
    resp.weight_versions = ()
    assert policy_version(resp) == 2  # an engine that sends no spans: its response version


def test_retention_check_saved_names_the_missing_role(tmp_path):
    from t1ops.campaign.retention import Retention
    for role in ("actor", "trainer_state"):
        (tmp_path / role / "step_00000004").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="left no critic checkpoint"):
        Retention(tmp_path).check_saved(4)
    Retention(tmp_path, needs_critic=False).check_saved(4)
