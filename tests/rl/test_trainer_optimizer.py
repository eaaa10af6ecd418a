"""The optimizer settings of ``[trainer]``: warmup and schedule, mini-batches, gradient clipping
(rl.trainer.optim, rl.trainer.packing.mini_batch_rows, RankTrainer.train_step).

Every test name contains "trainer" so that ``pytest -k trainer`` selects them.
"""
from __future__ import annotations

import math

import pytest
import torch

from rl.errors import InputError
from rl.trainer import Trainer, TrainerSettings
from rl.trainer.optim import lr_factor
from rl.trainer.packing import mini_batch_rows
from tests.rl.test_trainer import SPEC, _toy_batch


def test_trainer_lr_constant_by_default_and_warmup_ramps():
    assert [lr_factor(t, TrainerSettings()) for t in (0, 5, 500)] == [1.0, 1.0, 1.0]
    s = TrainerSettings(lr_warmup_steps=4)
    assert [lr_factor(t, s) for t in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_trainer_lr_cosine_and_linear_decay_to_the_floor():
    cos = TrainerSettings(lr_warmup_steps=2, lr_schedule="cosine", lr_decay_steps=12, lr_min_ratio=0.1)
    assert lr_factor(2, cos) == pytest.approx(1.0)                      # decay starts after warmup
    assert lr_factor(7, cos) == pytest.approx(0.1 + 0.9 * 0.5)         # half way: the cosine's midpoint
    assert lr_factor(12, cos) == pytest.approx(0.1) == lr_factor(40, cos)  # the floor holds
    lin = TrainerSettings(lr_schedule="linear", lr_decay_steps=10)
    assert [round(lr_factor(t, lin), 6) for t in (0, 5, 10, 11)] == [1.0, 0.5, 0.0, 0.0]


def test_trainer_decaying_schedule_needs_its_end():
    with pytest.raises(ValueError, match="lr_decay_steps"):
        TrainerSettings(lr_schedule="cosine")
    with pytest.raises(ValueError, match="must be above"):
        TrainerSettings(lr_warmup_steps=5, lr_schedule="linear", lr_decay_steps=5)


def test_trainer_mini_batch_rows_keep_groups_together():
    assert mini_batch_rows([0, 0, 1, 1, 2, 2, 3, 3], 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mini_batch_rows([7, 7, 5, 5, 9], 3) == [[0, 1], [2, 3], [4]]
    with pytest.raises(InputError, match="at least that many prompt groups"):
        mini_batch_rows([0, 0, 1, 1], 3)


def _step(settings: TrainerSettings, steps: int = 1):
    trainer = Trainer(SPEC, settings, seed=0)
    g = torch.Generator().manual_seed(0)
    before = {k: v.clone() for k, v in trainer.actor.state_dict().items() if isinstance(v, torch.Tensor)}
    stats = [trainer.train_step(_toy_batch(trainer.actor, g, 4, 2)) for _ in range(steps)]
    moved = sum(float((v - before[k]).abs().sum()) for k, v in trainer.actor.state_dict().items() if k in before)
    return trainer, stats, moved


def test_trainer_mini_batches_take_one_clipped_step_each():
    base = dict(mode="grpo", actor_lr=1e-2, ppo_epochs=2)
    _, (one,), moved_one = _step(TrainerSettings(**base))
    _, (four,), moved_four = _step(TrainerSettings(**base, mini_batches=4))
    assert (one.optimizer_steps, four.optimizer_steps) == (2, 8)
    assert math.isfinite(four.actor_grad_norm) and math.isfinite(four.logprob_gap) and math.isfinite(four.entropy)
    assert moved_four > 1.5 * moved_one  # Adam's steps are ~lr each: 8 steps move the weights further than 2


def test_trainer_warmup_scales_the_lr_of_both_roles():
    trainer, stats, _ = _step(TrainerSettings(mode="ppo", actor_lr=1e-2, critic_lr_multiplier=2.0,
                                              lr_warmup_steps=4), steps=2)
    assert [s.actor_lr for s in stats] == pytest.approx([2.5e-3, 5e-3])
    assert trainer.actor_optimizer.param_groups[0]["lr"] == pytest.approx(5e-3)
    assert trainer.critic_optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)

