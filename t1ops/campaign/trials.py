"""What names one trial, for every path that runs trials: training batches (``rollout``), async
groups (``rollout_group``) and held-out evaluation (``evaluate``) on the rollout worker; and the
sampling seed of each of its generation requests (docs/determinism.md)."""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class TrialSpec:
    task: str
    group_id: str
    sample_idx: int


def request_seed(run_seed: int, step: int, spec: TrialSpec, call: int) -> int:
    """The sampling seed of a trial's ``call``-th generation request: a pure function of the run's
    seed, the step, the trial (its group id, which holds the step and the group's index in the plan,
    and its sample index) and the call index. The same trial samples the same tokens on any engine,
    after any resubmission or resume; two trials of a group sample differently."""
    key = f"{run_seed}/{step}/{spec.group_id}/{spec.sample_idx}/{call}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1  # < 2**63: any torch Generator seed


def seeded(request, seed: int):
    """``request`` with ``sampling_params.sampling_seed = seed``, unless it already carries one (a
    harness that chose its own seed keeps it)."""
    params = request.sampling_params
    if params.sampling_seed is not None:
        return request
    return dataclasses.replace(request, sampling_params=dataclasses.replace(params, sampling_seed=seed))
