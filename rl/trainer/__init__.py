"""The trainer: megatron-core actor and critic, R3 replay, PPO and GRPO/DPPO steps.

Public API::

    settings = TrainerSettings.from_mapping(cfg.trainer.model_dump(exclude={"parallel"}))
    trainer = Trainer(ModelSpec(...), settings, seed=0, unk_id=vocab.unk_id)
    batch = TrainBatch.from_sequences(tokens=..., loss_mask=..., rollout_logprobs=..., routing=...,
                                      rewards=..., group_ids=..., prompt_ids=...)
    stats = trainer.train_step(batch)          # StepStats (EV, gap, clip fraction, TIS, grad norms)
    trainer.sft_step(tokens, loss_mask)        # supervised warm start
    trainer.snapshot_behaviour()               # inside the weight-sync barrier
    measure_routing_gap(trainer.actor, batch)  # R3 off vs on on one batch (routing-drift)
"""
from rl.trainer.batch import TrainBatch
from rl.trainer.r3 import RoutingGap, measure_routing_gap
from rl.trainer.sampling import rollout_batch, sample_responses, score_with_routing
from rl.trainer.settings import TrainerSettings
from rl.trainer.sft import SftStats
from rl.trainer.trainer import StepStats, Trainer

__all__ = ["TrainBatch", "RoutingGap", "measure_routing_gap", "rollout_batch", "sample_responses",
           "score_with_routing", "TrainerSettings", "SftStats", "StepStats", "Trainer"]
