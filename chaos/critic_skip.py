"""`t1ops run` with the critic-checkpoint-skipped fault, for verify-recovery's ``critic-skip``.

``python -m chaos.critic_skip STEP CONFIG [t1ops run options]`` is ``t1ops run CONFIG [options]``
whose trainer, from campaign step ``STEP`` on, silently skips the critic's checkpoint save (miles
#2224; runbooks/critic-checkpoint-skipped.md): at the start of that step the chaos seam of
``run_campaign`` (``on_step``) wraps the ``save`` of each trainer rank's checkpoint manager, in the
rank's own process (``__ray_call__``), so that a ``critic`` save returns without writing. The
production check after the save (``Retention.check_saved`` in ``TrainerHost.publish``) is not
touched: it stops the run with ``CheckpointError`` at that step, and verify-recovery resumes the run
(``--resume``, a plain ``t1ops run``) from the last complete resume point."""
from __future__ import annotations

import sys

import ray

from t1ops import cli


def skip_critic_saves(host, from_step: int) -> int:
    """Inside a ``TrainerHost``: its critic saves of ``from_step`` and later write nothing, say nothing."""
    save = host.ckpt.save

    def save_but_the_critic(role: str, step: int, state_dict):
        if role == "critic" and step >= from_step:
            return host.ckpt.dir_for(role)  # skipped silently, as the refactor in miles #2224 did
        return save(role, step, state_dict)

    host.ckpt.save = save_but_the_critic
    return host.rank


def at_step(step: int):
    """The ``on_step`` hook: at the start of campaign step ``step``, every trainer rank skips its critic saves."""
    def hook(campaign, now: int) -> None:
        if now == step:
            ray.get([a.__ray_call__.remote(skip_critic_saves, step) for a in campaign.trainer.actors])
    return hook


def main(argv: list[str]) -> int:
    from t1ops.campaign import launch  # torch and megatron: only when run

    step, run = int(argv[0]), launch.run_campaign
    launch.run_campaign = lambda cfg, **kw: run(cfg, **{**kw, "on_step": [*(kw.get("on_step") or []), at_step(step)]})
    return cli.main(["run", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
