"""TITO (token-in, token-out): the token-faithful trajectory and its accounting.

The trainer must consume exactly the ids the engine sampled (T1 report,
section 05). :class:`TitoBuilder` keeps the aligned arrays of the data
contract (docs/architecture.md) for one trajectory:

``tokens``, ``loss_mask`` (1 = sampled), ``rollout_logprobs`` (0 off-loss),
``routing`` (num_tokens x layers x topk int32, optional), ``policy_version``,
plus ``engine_tokens`` (the id the engine sampled or was fed at that position
when it first appeared) and ``origin`` (ALIGNED / RETOKENIZED / PLACEHOLDER).

Two ways in:

- token-in (we own both ends): ``add_observation(ids)`` then
  ``add_generation(...)``; the next prompt *is* ``tokens``. Per-turn cost is
  the turn's own size, never the history's. ``start_chunk(ids)`` starts a
  new chunk when the context is replaced (history compaction).
- harness mode: ``add_turn(prompt_ids, ...)`` with the ids the harness fed
  the engine. The prompt is compared with the stream by four relations,
  strongest first (:data:`RELATIONS`): ``strict`` (the stream is a token
  prefix), ``normalized`` (one bounded repair at the first divergence: drop
  ``a`` < 97 stream tokens, skip ``b`` < 17 prompt tokens, the report's
  97 x 17 grid; each repair is logged), ``retokenized`` (the stream's bytes are
  a prefix of the prompt's at a token boundary; the span is located with the
  generation-time byte-offset map), ``split`` (a new chunk with the same
  group id). In every case the stream keeps the sampled ids; the harness's
  re-tokenised copy never enters it. Positions whose later-turn conditioning
  differed are marked RETOKENIZED.

Drift = positions where ``tokens != engine_tokens``; inside the loss region it
must be 0 (:meth:`Trajectory.check_invariants`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from rl.chat import STOP_IDS, token_bytes
from rl.errors import InputError, MissingRoutingError, RoutingError, TitoError
from rl.routing import fill_missing_rows
from rl.tito_relations import (MAX_DROP_STREAM, MAX_SKIP_PROMPT, common_prefix_len,  # noqa: F401 (re-exported)
                               find_normalized_repair, find_retokenized_span)

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "token-drift": (),
}

log = logging.getLogger("rl.tito")

RELATIONS = ("strict", "normalized", "retokenized", "split")
ALIGNED, RETOKENIZED, PLACEHOLDER = 0, 1, 2


@dataclass
class Trajectory:
    """One chunk of a trajectory: the data contract's aligned arrays plus metadata."""

    tokens: np.ndarray            # (N,) int64
    loss_mask: np.ndarray         # (N,) int8
    rollout_logprobs: np.ndarray  # (N,) float32
    engine_tokens: np.ndarray     # (N,) int64
    origin: np.ndarray            # (N,) int8: ALIGNED / RETOKENIZED / PLACEHOLDER
    policy_version: np.ndarray    # (N,) int32, -1 where nothing was sampled
    routing: np.ndarray | None    # (N, L, K) int32 or None (no R3)
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def check_invariants(self) -> None:
        """Raise TitoError/RoutingError if the data contract does not hold."""
        n, name = len(self), self.meta.get("sample_id", "?")
        for key in ("loss_mask", "rollout_logprobs", "engine_tokens", "origin", "policy_version"):
            if getattr(self, key).shape != (n,):
                raise TitoError(f"sample {name}: {key} has shape {getattr(self, key).shape}, "
                                f"tokens has ({n},)", sample=name, array=key)
        if self.routing is not None and self.routing.shape[0] != n:
            raise RoutingError(f"sample {name}: {self.routing.shape[0]} routing rows for {n} tokens",
                               sample=name, num_rows=self.routing.shape[0], num_tokens=n)
        if not np.isin(self.loss_mask, (0, 1)).all():
            raise TitoError(f"sample {name}: loss_mask holds values other than 0/1", sample=name)
        off = self.loss_mask == 0
        if np.any(self.rollout_logprobs[off] != 0):
            raise TitoError(f"sample {name}: non-zero rollout log-prob on an observation position",
                            sample=name)
        drift = np.flatnonzero((self.loss_mask == 1) & (self.tokens != self.engine_tokens))
        if drift.size:
            raise TitoError(f"sample {name}: {drift.size} loss-bearing position(s) (first {int(drift[0])}) "
                            "hold an id the engine never sampled", sample=name, drift=drift.size)

    def accounting(self) -> dict[str, int]:
        """Per-token counts: positions, loss, aligned/retokenized/placeholder, drift."""
        loss = self.loss_mask == 1
        drift = self.tokens != self.engine_tokens
        return {"positions": len(self), "loss_positions": int(loss.sum()),
                "aligned": int((self.origin == ALIGNED).sum()),
                "retokenized": int((self.origin == RETOKENIZED).sum()),
                "placeholder": int((self.origin == PLACEHOLDER).sum()),
                "drift": int(drift.sum()), "drift_in_loss": int((drift & loss).sum()),
                "routing_rows": 0 if self.routing is None else int(self.routing.shape[0])}


# --- builder ------------------------------------------------------------------------
class TitoBuilder:
    """Assembles one trajectory (possibly several chunks) from engine turns.

    ``num_layers``/``topk`` set: routing is required on every turn (absent ->
    MissingRoutingError naming the sample). ``tokenizer`` is needed for the
    retokenized relation (byte-offset map); without it that relation is
    skipped and such a turn splits. Routing rows are stitched at :meth:`finish`:
    a position no turn routed gets a neighbour's row only if no loss-bearing
    token follows it (the last sampled token), otherwise RoutingError.
    """

    def __init__(self, prompt_ids: Sequence[int], *, sample_id: str, group_id: str = "",
                 prompt_id: str = "", tokenizer=None, num_layers: int | None = None,
                 topk: int | None = None, stop_ids: frozenset[int] = STOP_IDS) -> None:
        if len(prompt_ids) == 0:
            raise InputError(f"sample {sample_id}: prompt_ids is empty", sample=sample_id)
        self.sample_id, self.group_id, self.prompt_id = sample_id, group_id or sample_id, prompt_id
        self.tokenizer, self.stop_ids = tokenizer, stop_ids
        self.routing_shape = (num_layers, topk) if num_layers else None
        self.chunks: list[Trajectory] = []
        self.num_turns = 0
        self._new_chunk(np.asarray(prompt_ids, dtype=np.int64))

    # -- state helpers
    def _new_chunk(self, prompt: np.ndarray) -> None:
        self._tok: list[int] = []
        self._eng: list[int] = []
        self._mask: list[int] = []
        self._lp: list[float] = []
        self._ver: list[int] = []
        self._origin: list[int] = []
        self._offsets: list[int] = [0]   # generation-time byte-offset map
        self._bytes = bytearray()
        self._relations: list[str] = []
        self._spans: list[list] = []     # [start, end, relation]: positions each turn added
        self._span_from = 0              # first position not yet attributed to a turn
        self._repairs: list[dict] = []
        self._generations: list[list] = []  # [request id, start, end): the stream span each request emitted
        self._segments: list[tuple[np.ndarray, np.ndarray]] = []  # (stream positions, rows)
        self._last_gen_end = -1
        # harness mode: the harness's own copy of the conversation (its last prompt, the sampled
        # reply, observations since) and each position's stream index (-1: not in the stream);
        # None while it equals the stream. Prompts are related to it, so an edit the harness
        # makes once (and keeps) costs one repair, not one per later turn.
        self._view: list[int] | None = None
        self._view_map: list[int] = []
        self._append(prompt, mask=0, version=-1)

    def _append(self, ids: np.ndarray, *, mask: int, version: int | Sequence[int],
                logprobs: Sequence[float] | None = None) -> None:
        ids_list = [int(x) for x in ids]
        if self._view is not None:
            self._view += ids_list
            self._view_map += range(len(self._tok), len(self._tok) + len(ids_list))
        # one version for the turn, or one per token (a request that spanned a weight sync)
        versions = [int(version)] * len(ids_list) if isinstance(version, (int, np.integer)) \
            else [int(v) for v in version]
        self._tok += ids_list
        self._eng += ids_list
        self._mask += [mask] * len(ids_list)
        self._lp += list(map(float, logprobs)) if logprobs is not None else [0.0] * len(ids_list)
        self._ver += versions
        self._origin += [ALIGNED] * len(ids_list)
        if self.tokenizer is not None:
            for t in ids_list:
                piece = token_bytes(self.tokenizer, t)
                self._bytes += piece
                self._offsets.append(self._offsets[-1] + len(piece))

    @property
    def tokens(self) -> list[int]:
        """The current chunk's stream: in token-in mode, the next prompt."""
        return list(self._tok)

    # -- token-in mode
    def add_observation(self, observation_ids: Sequence[int]) -> None:
        """Append environment ids (mask 0), e.g. from ``ChatRenderer.observation_ids``."""
        self._check_last_turn_stopped()
        self._append(np.asarray(observation_ids, dtype=np.int64), mask=0, version=-1)

    def add_generation(self, output_ids: Sequence[int], output_logprobs: Sequence[float], *,
                       policy_version: int | Sequence[int], routing_rows: np.ndarray | None = None,
                       routing_start: int = 0, rid: str | None = None) -> None:
        """Append one sampled turn whose prompt was exactly ``self.tokens`` (strict). ``rid``: the
        engine request that emitted it (``meta["generations"]``, matched by the audit against the
        engine's own record)."""
        # identity prompt map (None): the cost stays the turn's size, not the history's
        self._record_generation("strict", None, len(self._tok), output_ids, output_logprobs,
                                policy_version, routing_rows, routing_start, rid)

    def start_chunk(self, prompt_ids: Sequence[int]) -> None:
        """Close the current chunk and start a new one whose stream is ``prompt_ids``.

        Token-in mode's explicit split: the context was replaced (history
        compaction, docs/compaction.md), so the next prompt does not extend the
        stream. The chunks share the group id; each is trained on its own.
        """
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        if prompt.shape[0] == 0:
            raise InputError(f"sample {self.sample_id}: the new chunk's prompt is empty", sample=self.sample_id)
        self.chunks.append(self._finish_chunk())
        self._new_chunk(prompt)

    # -- harness mode
    def add_turn(self, prompt_ids: Sequence[int], output_ids: Sequence[int],
                 output_logprobs: Sequence[float], *, policy_version: int | Sequence[int],
                 routing_rows: np.ndarray | None = None, routing_start: int = 0, rid: str | None = None) -> str:
        """Add a turn whose prompt the harness rendered; returns the relation that held.

        After a truncated turn (no stop token) nothing may follow in the same
        chunk, so the turn splits. Each chunk's ``meta["turn_spans"]`` lists
        ``[start, end, relation]``: the positions each turn added (the audit's shares).
        """
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        if self._last_turn_truncated():  # nothing may follow a truncated turn in its chunk
            relation, prompt_map, obs_from = "split", None, prompt.shape[0]
        else:
            relation, prompt_map, obs_from = self._relate(prompt)
        if relation == "split":
            self.chunks.append(self._finish_chunk())
            self._new_chunk(prompt)
            prompt_map, obs_from = np.arange(prompt.shape[0], dtype=np.int64), prompt.shape[0]
        else:
            base = len(self._tok)
            self._append(prompt[obs_from:], mask=0, version=-1)
            prompt_map[obs_from:] = base + np.arange(prompt.shape[0] - obs_from)
        gen_start = len(self._tok)
        self._record_generation(relation, prompt_map, prompt.shape[0], output_ids,
                                output_logprobs, policy_version, routing_rows, routing_start, rid)
        self._view = prompt.tolist() + [int(x) for x in output_ids]
        self._view_map = prompt_map.tolist() + list(range(gen_start, len(self._tok)))
        return relation

    def _reference(self) -> tuple[np.ndarray, np.ndarray]:
        """The sequence a harness prompt should extend, and its stream positions (see ``_view``)."""
        if self._view is None:
            return np.asarray(self._tok, dtype=np.int64), np.arange(len(self._tok), dtype=np.int64)
        return np.asarray(self._view, dtype=np.int64), np.asarray(self._view_map, dtype=np.int64)

    def _reference_bytes(self, ref: np.ndarray) -> tuple[list[int], bytes]:
        if self._view is None:
            return self._offsets, bytes(self._bytes)
        offsets, buf = [0], bytearray()
        for t in ref.tolist():
            piece = token_bytes(self.tokenizer, t)
            buf += piece
            offsets.append(offsets[-1] + len(piece))
        return offsets, bytes(buf)

    def _relate(self, prompt: np.ndarray) -> tuple[str, np.ndarray, int]:
        """Relation, map prompt position -> stream position (-1: none), first observation index."""
        ref, rmap = self._reference()
        n, m = ref.shape[0], prompt.shape[0]
        pmap = np.full(m, -1, dtype=np.int64)
        if m >= n and np.array_equal(ref, prompt[:n]):
            pmap[:n] = rmap
            return "strict", pmap, n
        repair = find_normalized_repair(ref, prompt)
        if repair is not None:
            i, a, b = repair
            pmap[:i] = rmap[:i]
            pmap[i + b:i + b + n - i - a] = rmap[i + a:n]
            self._mark_retokenized(j for j in rmap[i:i + a].tolist() if j >= 0)
            rec = {"turn": self.num_turns, "at": i, "drop_stream": a, "skip_prompt": b}
            self._repairs.append(rec)
            log.info("sample %s: normalized repair %s", self.sample_id, rec)
            return "normalized", pmap, i + b + n - i - a
        if self.tokenizer is not None:
            offsets, data = self._reference_bytes(ref)
            found = find_retokenized_span(offsets, data, prompt.tolist(), self.tokenizer)
            if found is not None:
                q_end, p_off = found
                self._map_by_offsets(ref, rmap, offsets, prompt, q_end, p_off, pmap)
                return "retokenized", pmap, q_end
        return "split", pmap, m

    def _map_by_offsets(self, ref: np.ndarray, rmap: np.ndarray, offsets: list[int], prompt: np.ndarray,
                        q_end: int, p_off: list[int], pmap: np.ndarray) -> None:
        """Align tokens with the same byte span and id; the rest of the reference is retokenized."""
        start_to_j = {offsets[j]: j for j in range(ref.shape[0])}
        matched = set()
        for q in range(q_end):
            j = start_to_j.get(p_off[q])
            if j is not None and ref[j] == prompt[q] and offsets[j + 1] == p_off[q + 1]:
                pmap[q] = rmap[j]
                matched.add(j)
        self._mark_retokenized(int(rmap[j]) for j in range(ref.shape[0]) if j not in matched and rmap[j] >= 0)

    def _mark_retokenized(self, positions) -> None:
        for j in positions:
            self._origin[j] = max(self._origin[j], RETOKENIZED)

    def _last_turn_truncated(self) -> bool:
        return self._last_gen_end >= 0 and self._tok[self._last_gen_end - 1] not in self.stop_ids

    def _check_last_turn_stopped(self) -> None:
        if self._last_turn_truncated():
            raise TitoError(
                f"sample {self.sample_id} turn {self.num_turns - 1}: generation ended with id "
                f"{self._tok[self._last_gen_end - 1]}, not a stop token {sorted(self.stop_ids)}; a "
                "truncated turn must end the trajectory", sample=self.sample_id,
                turn=self.num_turns - 1, num_tokens=len(self._tok))

    def _record_generation(self, relation: str, prompt_map: np.ndarray | None, prompt_len: int,
                           output_ids, output_logprobs, policy_version: int,
                           routing_rows: np.ndarray | None, routing_start: int, rid: str | None = None) -> None:
        turn = self.num_turns
        if len(output_ids) == 0 or len(output_logprobs) != len(output_ids):
            raise TitoError(f"sample {self.sample_id} turn {turn}: {len(output_ids)} output ids and "
                            f"{len(output_logprobs)} log-probs (need equal, non-zero counts)",
                            sample=self.sample_id, turn=turn)
        if not isinstance(policy_version, (int, np.integer)) and len(policy_version) != len(output_ids):
            raise TitoError(f"sample {self.sample_id} turn {turn}: {len(output_ids)} output ids and "
                            f"{len(policy_version)} per-token policy versions", sample=self.sample_id, turn=turn)
        gen_start = len(self._tok)
        self._append(np.asarray(output_ids, dtype=np.int64), mask=1, version=policy_version,
                     logprobs=output_logprobs)
        self._add_routing(prompt_map, gen_start, prompt_len + len(output_ids), routing_rows,
                          routing_start)
        self._relations.append(relation)
        self._generations.append([rid, gen_start, len(self._tok)])
        self._spans.append([self._span_from, len(self._tok), relation])
        self._span_from = len(self._tok)
        self._last_gen_end = len(self._tok)
        self.num_turns += 1

    def _add_routing(self, prompt_map: np.ndarray | None, gen_start: int, seqlen: int,
                     rows: np.ndarray | None, start: int) -> None:
        """Keep this turn's rows with the stream positions they describe.

        ``prompt_map[q]`` = stream position of prompt position q (-1: none;
        ``None``: identity); generated positions follow ``gen_start``.
        """
        if self.routing_shape is None:
            return
        turn = self.num_turns
        if rows is None:
            raise MissingRoutingError(
                f"trial {self.sample_id} turn {turn}: the engine returned no routing; the rollout "
                "aborts (dropping the sample would bias the batch toward successful captures)",
                sample=self.sample_id, turn=turn)
        want = seqlen - 1 - start
        if rows.shape[0] != want or rows.shape[1:] != self.routing_shape:
            raise RoutingError(
                f"sample {self.sample_id} turn {turn}: routing has shape {rows.shape}, expected "
                f"({want}, {self.routing_shape[0]}, {self.routing_shape[1]}) for positions "
                f"[{start}, {seqlen - 1})", sample=self.sample_id, turn=turn,
                num_rows=rows.shape[0], expected_rows=want)
        if prompt_map is None:
            positions = np.arange(start, seqlen - 1, dtype=np.int64)
        else:
            num_gen = seqlen - prompt_map.shape[0]
            positions = np.concatenate([prompt_map, gen_start + np.arange(num_gen)])[start:seqlen - 1]
        self._segments.append((positions, np.asarray(rows, dtype=np.int32)))

    def _stitched_routing(self, n: int, mask: np.ndarray, origin: np.ndarray) -> np.ndarray | None:
        if self.routing_shape is None:
            return None
        rows = np.zeros((n,) + self.routing_shape, dtype=np.int32)
        has = np.zeros(n, dtype=bool)
        for pos, seg in self._segments:  # earlier turns win: the row from the first capture
            ok = pos >= 0
            pos, seg = pos[ok], seg[ok]
            new = ~has[pos]
            rows[pos[new]] = seg[new]
            has[pos[new]] = True
        filled = fill_missing_rows(rows, has, mask, sample=self.sample_id)
        origin[filled] = PLACEHOLDER
        return rows

    def _finish_chunk(self) -> Trajectory:
        n = len(self._tok)
        mask = np.asarray(self._mask, dtype=np.int8)
        origin = np.asarray(self._origin, dtype=np.int8)
        routing = self._stitched_routing(n, mask, origin)
        traj = Trajectory(
            tokens=np.asarray(self._tok, dtype=np.int64), loss_mask=mask,
            rollout_logprobs=np.asarray(self._lp, dtype=np.float32),
            engine_tokens=np.asarray(self._eng, dtype=np.int64), origin=origin,
            policy_version=np.asarray(self._ver, dtype=np.int32), routing=routing,
            meta={"sample_id": self.sample_id, "group_id": self.group_id, "prompt_id": self.prompt_id,
                  "chunk_id": len(self.chunks), "relations": list(self._relations),
                  "turn_spans": [list(x) for x in self._spans], "repairs": list(self._repairs),
                  "generations": [list(g) for g in self._generations]})
        traj.check_invariants()
        return traj

    def finish(self) -> list[Trajectory]:
        """Close the trajectory: one Trajectory per chunk, invariants checked."""
        if self.num_turns == 0:
            raise TitoError(f"sample {self.sample_id}: no generation was recorded", sample=self.sample_id)
        chunks = self.chunks + [self._finish_chunk()]
        for c in chunks:
            c.meta["num_turns"] = self.num_turns
            c.meta["num_chunks"] = len(chunks)
        return chunks
