"""critic-checkpoint-skipped: the critic's checkpoints are silently skipped; a resume loses days.

miles issue #2224 (github.com/radixark/miles/issues/2224): critic checkpoints were silently skipped;
the actor saved every interval, nothing warned, and a resume could not restore the critic.

Fault (real): the production trainer role (``TrainerHost``, PPO: actor + critic, ``save_every`` 2)
publishes steps 0..7; from step 4 on the critic object it holds is gone (``trainer.critic`` None,
as a refactor or an offload that drops the reference would leave it), so ``publish``'s
``if critic is not None`` skips the critic's save without a word.

- Unguarded (no check after the save): steps 4 and 6 save the actor and the trainer state, no
  error; the resume point (``plan_resume``) stays at step 2: a crash at step 7 loses 5 steps.
- Guarded: ``Retention.check_saved`` right after every resume-point save (``TrainerHost.publish``)
  raises ``CheckpointError`` at step 4 naming the missing role and the step a resume would go back
  to; nothing after the last complete resume point is trained unprotected.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from chaos.harness import Guarded, Outcome, Timeline, register
from t1ops.errors import CheckpointError

SAVE_EVERY, STEPS, SKIP_FROM = 2, 8, 4


def _host(tmp: Path, name: str):
    from chaos.trainer_fixture import tiny_trainer_host
    from t1ops.config import CheckpointsConfig

    return tiny_trainer_host(tmp, name, CheckpointsConfig(keep_last=2, keep_every=0), save_every=SAVE_EVERY,
                             mode="ppo")


def _publish_all(host, guarded: bool, tl: Timeline | None) -> tuple[int | None, Exception | None]:
    import dataclasses

    from t1ops.campaign.retention import Retention

    class Unchecked(Retention):
        def check_saved(self, step: int) -> None:  # the save as it was: nothing checked after it
            return None

    if not guarded:
        r = host.retention
        host.retention = Unchecked(**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)})
    critic = host.trainer.critic
    try:
        for v in range(STEPS):
            if v == SKIP_FROM:
                host.trainer.critic = None  # the critic's save is skipped from here on, silently
                if tl is not None:
                    tl.fault()
            host.publish(v, final=v == STEPS - 1)
        err = None
    except CheckpointError as e:
        err = e
        if tl is not None:
            tl.detected()
    finally:
        host.trainer.critic = critic
    return Retention(host.retention.base).resume_point(), err


@register("critic-checkpoint-skipped", "the critic's checkpoints are silently skipped; a resume loses days")
def run(tmp: Path) -> Outcome:
    from t1ops.campaign.resume import plan_resume
    from t1ops.guards.checkpoints import list_steps

    torch.set_num_threads(1)
    bad = _host(tmp, "unguarded")
    bad_point, bad_err = _publish_all(bad, guarded=False, tl=None)
    base = Path(bad.retention.base)
    bad_actor, bad_critic = list_steps(base / "actor"), list_steps(base / "critic")
    resume_step = plan_resume(base, needs_critic=True).step

    tl = Timeline()
    good = _host(tmp, "guarded")
    t0 = time.monotonic()
    good_point, err = _publish_all(good, guarded=True, tl=tl)
    detect_s = tl.since_fault("detected")
    gbase = Path(good.retention.base)
    resumed = plan_resume(gbase, needs_critic=True).step
    tl.healthy()
    return Outcome(
        fault_fired=max(bad_critic) < SKIP_FROM and max(bad_actor) == STEPS - 1,
        unguarded=(f"critic saves skipped from step {SKIP_FROM}: actor steps {bad_actor}, critic steps {bad_critic}, "
                   f"no error; a resume after step {STEPS - 1} goes back to step {resume_step} "
                   f"({STEPS - 1 - resume_step} steps lost)"),
        guarded=Guarded(caught=isinstance(err, CheckpointError), detection_s=detect_s,
                        error=str(err)[:300] if err else "not caught"),
        invariants={
            "unguarded_resume_point_left_behind_silently": bad_err is None and resume_step == SKIP_FROM - SAVE_EVERY
            and max(bad_actor) == STEPS - 1,
            "caught_at_the_first_incomplete_save": isinstance(err, CheckpointError) and f"step {SKIP_FROM}" in str(err)
            and "critic" in str(err),
            "guarded_resume_point_is_the_last_complete_one": resumed == SKIP_FROM - SAVE_EVERY == good_point,
        },
        details={"unguarded_actor_steps": bad_actor, "unguarded_critic_steps": bad_critic,
                 "unguarded_resume_step": resume_step, "guarded_resume_step": resumed,
                 "guarded_s": round(time.monotonic() - t0, 3)},
        recovery=tl.recovery(steps_lost=SKIP_FROM - resumed, how="stop at the incomplete save; --resume from the "
                                                                 "last complete resume point"))
