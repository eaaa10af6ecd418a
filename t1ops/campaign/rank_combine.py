"""Where a multi-rank trainer call becomes one answer: rank 0's, once every rank has answered.

:class:`t1ops.campaign.rank_actors.TrainerGroup` sends a call to every rank and returns one reference to
:meth:`Combiner.combine`'s result, so the step loop waits on one reference for 1 rank or N. The
combiner is one small actor per rank group, in a module that imports nothing. It was a Ray task
defined in ``rank_actors`` before: every worker that ran it imported torch and the trainer (about
2.6 CPU-s), and a two-rank campaign started three such workers, since calls overlap at start-up.
One actor runs the combines in the order they were sent, as the ranks run the calls themselves.
"""
from __future__ import annotations


class Combiner:
    """The rank group's actor, combining the results of one broadcast call."""

    def combine(self, name: str, *results):
        """Rank 0's answer; ``train`` also carries every rank's timing (per-rank telemetry)."""
        if name == "train":  # a roles.TrainReport from each rank
            import dataclasses  # the standard library only: this module imports nothing at load

            # a skipped step (no signal) ran on no rank: no rank info
            return dataclasses.replace(results[0], rank_info=None,
                                       ranks=[r.rank_info for r in results if r.rank_info is not None])
        return results[0]
