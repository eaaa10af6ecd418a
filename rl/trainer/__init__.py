"""The trainer: megatron-core actor and critic, R3 replay, PPO and GRPO/DPPO steps.

Public API::

    settings = TrainerSettings(actor_lr=1e-3)   # or cfg.trainer: t1ops.config.TrainerConfig extends it
    trainer = Trainer(ModelSpec(...), settings, seed=0, unk_id=vocab.unk_id)
    batch = TrainBatch.from_sequences(tokens=..., loss_mask=..., rollout_logprobs=..., routing=...,
                                      rewards=..., group_ids=..., prompt_ids=...)
    stats = trainer.train_step(batch)          # StepStats (EV, gap, clip fraction, TIS, grad norms)
    trainer.sft_step(tokens, loss_mask)        # supervised warm start
    trainer.snapshot_behaviour()               # inside the weight-sync barrier
    measure_routing_gap(trainer.actor, batch)  # R3 off vs on on one batch (routing-drift)
"""
import importlib

# Loaded on first use, so ``rl.trainer.settings`` (the [trainer] config model) imports without torch.
_EXPORTS = {"TrainBatch": "rl.trainer.batch", "RoutingGap": "rl.trainer.r3", "measure_routing_gap": "rl.trainer.r3",
            "rollout_batch": "rl.trainer.sampling", "sample_responses": "rl.trainer.sampling",
            "score_with_routing": "rl.trainer.sampling", "TrainerSettings": "rl.trainer.settings",
            "SftStats": "rl.trainer.sft", "StepStats": "rl.trainer.step", "Trainer": "rl.trainer.trainer"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rl.trainer' has no attribute {name!r}")
