"""What names one trial and what one returns, for every path that runs trials: training batches
(``rollout``), async groups (``rollout_group``) and held-out evaluation (``evaluate``) on the
rollout worker; and the sampling seed of each of its generation requests (docs/determinism.md).

:class:`TrialResult` is the one shape of a finished trial, from the worker's trial runner to the
trainer (``t1ops.campaign.trainer_host``), the step row, the dumps and the evaluation; a group
of the fully async pipeline comes back as a :class:`GroupResult`, a batch shard as a
:class:`BatchResult`. They travel over Ray (pickled: frozen slotted dataclasses, no torch), so
this module imports nothing heavy: the rollout workers never import torch.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any


EVAL_GROUP_PREFIX = "eval"  # held-out evaluation's groups: "eval<step>-<task>" (t1ops.campaign.evaluation)


def eval_group_id(step: int, task: str) -> str:
    """The group id of ``task``'s held-out evaluation trials at ``step``."""
    return f"{EVAL_GROUP_PREFIX}{step}-{task}"


def is_eval_group(group_id: str) -> bool:
    """Whether ``group_id`` names evaluation trials (not a training group): what reads the run's
    telemetry back (``t1ops plan simulate --from``) keeps the two apart."""
    head, sep, _ = group_id.partition("-")
    return bool(sep) and head.startswith(EVAL_GROUP_PREFIX) and head[len(EVAL_GROUP_PREFIX):].isdigit()


@dataclass(frozen=True)
class TrialSpec:
    task: str
    group_id: str
    sample_idx: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialResult:
    """One finished trial (``RolloutWorker._trial``; a failed one kept by ``rollout.failed_trials =
    "zero"``: :func:`failed_row`). Read by attribute everywhere."""

    task: str                           # the task's name
    group_id: str                       # its GRPO group (one prompt's samples; the plan's group id)
    sample_id: str                      # "<group_id>-s<sample index>": unique in the run
    reward: float                       # the verdict's reward as logged (reward_policy derives the trained one)
    trial_id: str = ""                  # the sandbox's trial id (a failed trial: its sample id)
    family: str = ""                    # the task's family (skim accounting, reports)
    reward_source: str = ""             # where the reward came from: "ctrf", "harbor:...", "no-verdict", "failed"
    reward_fallback: str | None = None  # why CTRF was not used, when it was not (T1 report, section 06)
    solved: bool | None = None          # fully solved by the verdict (None: judged from passed == total)
    passed: int | None = None           # CTRF tests passed (None: no CTRF verdict)
    total: int | None = None            # CTRF tests run (None: no CTRF verdict)
    num_turns: int = 0                  # agent turns taken
    end_reason: str = ""                # why the episode ended: "done", "truncated", "context_exhausted", "failed", ...
    commands: list = field(default_factory=list)  # the commands the agent ran, in order
    parse_failures: int = 0             # replies whose tool call did not parse
    harness: dict | None = None         # a command harness's own stats (rollout.agent = "command")
    compactions: int = 0                # context compactions (summaries) during the episode
    summary_failures: int = 0           # compactions whose summary failed
    tamper: list = field(default_factory=list)  # verifier tamper events (asdict of rl.agent.verifier events)
    failed: bool = False                # the trial raised and is kept as reward 0, mask 0 (failed_trials = "zero")
    error: str | None = None            # a failed trial's error, "Type: message" (300 chars)
    queue_s: float = 0.0                # seconds waiting for a concurrency slot and the sandbox bucket
    sandbox_s: float = 0.0              # seconds creating the sandbox, running commands, sweeping
    generate_s: float = 0.0             # seconds in /generate calls
    verify_s: float = 0.0               # seconds in the verifier
    trial_s: float = 0.0                # wall seconds of the trial, queue included
    chunks: list | None = None          # the TITO trajectories (rl.tito.Trajectory); None once staged
    payload: Any = None                 # staged: where the chunks are (t1ops.campaign.dataplane.Payload)
    loss_versions: dict | None = None   # staged: loss tokens by the policy version that sampled them
    loss_relations: dict | None = None  # staged: {"loss": loss tokens, "retokenized": those retokenized or split}

    def replace(self, **changes) -> "TrialResult":
        return dataclasses.replace(self, **changes)

    @property
    def sample_idx(self) -> int:
        """The sample index within its group (from ``sample_id``)."""
        return int(self.sample_id.rsplit("-s", 1)[1])

    @property
    def staged(self) -> bool:
        """Its chunks are in the object store, not in this object (``t1ops.campaign.dataplane.stage``)."""
        return self.chunks is None


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchResult:
    """One worker's share of a training batch (``RolloutWorker.rollout``) or of an evaluation
    (``RolloutWorker.evaluate``): the kept trials in plan order and their books."""

    results: list                       # TrialResult of the accepted (kept) trials, in plan order
    ledger: dict                        # the trial ledger's books: expected, completed, failed, cancelled, missing
    failed: dict                        # trial id -> error text, of every failed trial
    node: str                           # the worker's node
    skim: dict = field(default_factory=dict)  # training: groups accepted / cancelled by family (skim)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupResult:
    """One prompt group of the fully async pipeline (``RolloutWorker.rollout_group``)."""

    group_id: str                       # the group's id (the planner's "ag<k>-<task>")
    task: str                           # the task all its samples run
    started_step: int                   # the step whose slot started it (its staleness tag)
    results: list                       # TrialResult of its completed (or kept failed) trials, in sample order
    ledger: dict                        # the group's trial ledger books (expected, completed, failed, cancelled, missing)
    failed: dict                        # trial id -> error text, of every failed trial
    node: str                           # the worker's node
    duration_s: float                   # wall seconds from its first trial's queue to its last result


def failed_row(spec: TrialSpec, family: str, err: BaseException) -> TrialResult:
    """A failed trial kept as reward 0 with loss mask 0 (``rollout.failed_trials = "zero"``; SkyRL
    walkthrough, section 5): no chunks, so it has no batch rows, but it counts in its group's
    baseline; a held-out evaluation counts it in its mean (``t1ops.campaign.evaluation``)."""
    sample_id = f"{spec.group_id}-s{spec.sample_idx}"
    return TrialResult(trial_id=sample_id, task=spec.task, family=family, group_id=spec.group_id,
                       sample_id=sample_id, reward=0.0, reward_source="failed", solved=False, end_reason="failed",
                       failed=True, error=f"{type(err).__name__}: {err}"[:300], chunks=[])


def require_results(results, where: str) -> list:
    """``results`` as a list of :class:`TrialResult`; a TypeError naming ``where`` and the fix
    for anything else (a dict-shaped result from code written for the old dict rows)."""
    results = list(results)
    bad = next((r for r in results if not isinstance(r, TrialResult)), None)
    if bad is not None:
        raise TypeError(f"{where} takes t1ops.campaign.trials.TrialResult objects, got a "
                        f"{type(bad).__name__}{' with keys ' + str(sorted(bad)[:6]) if isinstance(bad, dict) else ''}; "
                        "trial results are typed: build them with TrialResult(...) and read them by attribute")
    return results


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
