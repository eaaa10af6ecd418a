"""An engine response recorded into a trajectory: the sampled ids with their log-probs, routing
rows and the weight version that sampled them. One place for the agent loop's turns and its
compaction summaries (rl/agent/loop.py, rl/agent/compaction.py)."""
from __future__ import annotations

# The failure ids of docs/failures.md this guard catches (`t1ops explain ID`): a token's version is
# the one recorded with it when it was sampled, never the response's version read again afterwards.
CATCHES = {
    "version-read-twice": (),
}


def record(builder, resp, routing_start: int) -> None:
    """Append ``resp``'s sampled turn to ``builder`` (a token-in ``TitoBuilder``)."""
    builder.add_generation(resp.output_ids, resp.output_token_logprobs or (), policy_version=policy_version(resp),
                           routing_rows=resp.routed_experts_RLK, routing_start=routing_start,
                           rid=getattr(resp, "rid", None))


def policy_version(resp) -> int | list[int]:
    """The weight version that sampled the turn, or one per token when the request spanned a
    weight sync (fully async: paused in place, resumed under the new weights).

    The per-token spans (recorded with each token under the engine's model lock) win over the
    response's ``weight_version``, which the engine reads once more when it builds the response: a
    sync landing between the last token and that read labels the turn with a version that did not
    sample it (AReaL #1569; runbooks/version-read-twice.md)."""
    spans = getattr(resp, "weight_versions", ()) or ()
    if len({s.version for s in spans}) > 1:
        per_token = [_as_int(resp.weight_version)] * len(resp.output_ids)
        for s in spans:
            per_token[s.start:s.end] = [_as_int(s.version)] * (s.end - s.start)
        return per_token
    return _as_int(spans[0].version if spans else resp.weight_version)


def _as_int(version) -> int:
    try:
        return int(version)
    except (TypeError, ValueError):
        return -1
