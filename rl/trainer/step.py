"""The pure parts of one trainer step, shared by every rank layout (1 rank included).

T1 report, section 03: the critic runs first; its pre-update values feed
both GAE and its own clipped value loss. The actor then recomputes old
log-probs under the behaviour snapshot and takes the clipped step. GRPO mode
(SkyRL walkthrough, section 6): group-centred advantages, the DPPO binary-TV
mask against the per-token rollout log-probs. The step itself (forwards,
losses, gradients, optimizer steps) has one implementation,
``rl.trainer.ranks.RankTrainer.train_step``; the 1-rank ``Trainer`` is its
world-size-1 case.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator, Mapping

import torch

from rl.advantages import grpo_trajectory_advantages
from rl.errors import InputError
from rl.trainer.batch import TrainBatch
from rl.trainer.settings import TrainerSettings


@dataclass(frozen=True)
class BehaviourPlan:
    """Which log-probs play which part in a step, for every rank layout (1 rank included).

    ``behaviour="snapshot"``: old log-probs are recomputed under the behaviour snapshot (the
    published weights that sampled the batch). ``behaviour="rollout"`` (fully async,
    docs/async.md): a trajectory may span versions, so the per-token rollout log-probs are the
    behaviour (the PPO ratio's denominator); TIS is then recorded, not applied on top."""

    recompute: bool           # old log-probs recomputed by the trainer (PPO, or TIS applied)
    ratio_from_rollout: bool  # the PPO ratio's denominator is the rollout's log-probs
    apply_tis: bool           # TIS weights multiply the per-token loss


def behaviour_plan(s: TrainerSettings, behaviour: str) -> BehaviourPlan:
    if behaviour not in ("snapshot", "rollout"):
        raise InputError(f"behaviour must be 'snapshot' or 'rollout', got {behaviour!r}", argument="behaviour")
    # several optimizer steps per batch: later parts' forwards run on updated weights, so the
    # behaviour (log-prob gap, entropy) is measured by a recompute under the snapshot
    return BehaviourPlan(recompute=s.mode == "ppo" or s.tis_mode != "off" or s.mini_batches > 1,
                         ratio_from_rollout=behaviour == "rollout",
                         apply_tis=s.tis_mode != "off" and behaviour != "rollout")


@dataclass
class StepStats:
    """One RL step's numbers (NaN where a quantity does not exist in this mode or step)."""

    step: int
    mode: str
    actor_updated: bool
    num_samples: int
    num_tokens: int  # loss-bearing tokens
    reward_mean: float
    explained_variance: float
    logprob_gap: float
    clip_fraction: float
    ratio_mean: float
    policy_loss: float
    value_loss: float
    actor_grad_norm: float
    critic_grad_norm: float
    tis_mean: float
    tis_max_raw: float
    tis_clip_fraction: float
    advantage_mean: float
    dual_clip_fraction: float = math.nan
    tis_mode: str = "off"             # "off": recorded only; "token"/"sequence": applied to the loss
    behaviour_recomputed: bool = True  # False: GRPO without TIS skipped the old-log-prob forward
    entropy: float = math.nan          # policy entropy over loss tokens, logged without gradient
    kl_behaviour: float = math.nan     # approx. KL(behaviour || policy) over the last epoch's forwards (k3)
    actor_lr: float = math.nan         # the actor's LR this step (warmup and schedule applied)
    optimizer_steps: int = 1           # actor optimizer steps this step: ppo_epochs x mini-batches (0: critic only)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def grpo_token_advantages(batch: TrainBatch, norm_by_std: bool = False) -> torch.Tensor:
    """Group-centred advantage per trajectory, ``[B]`` (a trajectory's chunks count once in the
    group baseline and share its advantage; row-less ``baseline_only`` trajectories count too);
    divided by the group std when ``norm_by_std`` (off by default, as the walkthrough)."""
    tids = batch.trajectory_ids if batch.trajectory_ids is not None else list(range(batch.num_samples))
    return grpo_trajectory_advantages(batch.rewards_B, batch.group_ids, tids, norm_by_std=norm_by_std,
                                      baseline_only=batch.baseline_only or ())


def masked_token_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """Mean of ``x`` over the loss-bearing tokens (NaN when there is none)."""
    n = int(mask_BT.sum())
    return float(x_BT.detach()[mask_BT].sum() / n) if n else float("nan")


def copy_state(state: Mapping[str, object]) -> dict[str, object]:
    """A detached copy of a state_dict (megatron's holds ``_extra_state: None`` entries too)."""
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


@contextlib.contextmanager
def swapped_weights(model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None) -> Iterator[None]:
    """Run the block with ``state`` loaded into ``model``, then restore its own weights."""
    if state is None:
        yield
        return
    own = copy_state(model.state_dict())
    model.load_state_dict(state)
    try:
        yield
    finally:
        model.load_state_dict(own)
