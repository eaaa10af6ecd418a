"""The one Ray task of a multi-rank trainer call: rank 0's answer once every rank has answered.

:class:`t1ops.campaign.rank_actors.RankGroup` sends a call to every rank and returns one reference to
this task's result, so the step loop waits on one reference for 1 rank or N. It lives in a module of
its own, importing nothing, because a Ray task's worker imports the module that defines the function:
defined in ``rank_actors`` (torch, megatron-core's trainer) each worker that ran it paid about
2.6 CPU-s of imports, and a two-rank campaign started three such workers.
"""
from __future__ import annotations


def combine(name: str, *results):
    """Rank 0's answer; ``train`` also carries every rank's timing (per-rank telemetry)."""
    if name == "train":
        return {**results[0], "ranks": [r.pop("rank_info", None) for r in results]}
    return results[0]
