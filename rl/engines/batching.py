"""Continuous batching over the K/V cache, with prefix reuse across a trajectory's turns.

One scheduler thread owns the model's forward passes (docs/engine.md). Each
iteration, under the engine's model lock:

1. admit waiting requests into cache slots. A request whose prompt extends a
   finished request's tokens (the next turn of a TITO trajectory: the prompt
   *is* the previous stream plus the observation) takes over that slot and
   only its new tokens are prefilled; a request sharing a shorter prefix with
   a finished one (a group's samples share the task prompt) gets a copy of
   the shared K/V and routing rows;
2. prefill the admitted requests (their uncached tokens, batched up to
   ``prefill_tokens`` padded positions per forward), sampling each one's
   first token;
3. decode one token for every other running request in one batched forward
   (up to ``max_batch``): a request that arrived meanwhile joins at the next
   iteration.

Batch-invariant mode (``batch_invariant=True``, ``engine.batch_invariant``, docs/determinism.md):
every forward carries one request only and no prefix is reused or shared, so a request's tokens
depend on its prompt, its seed and the weights alone, never on what else the engine was serving
(batched GEMMs and padded prefills are not bit-stable across batch compositions). Throughput is
that of one request at a time; the K/V cache still saves the per-token recompute.

Routing rows are recorded per fed position exactly as the recompute path does:
a position's row comes from the forward that first fed it, prompt rows from
the prefill, each sampled token's row from the forward that feeds it; the last
token has none. Weight updates bump the engine's ``weights_generation``:
retained slots are dropped and running requests re-prefill everything under
the new weights. Pause, abort and versions keep the engine's semantics: no
step runs while paused, aborted requests finish at the next iteration with
``finish_reason`` abort (paused or not), each token records the version that
sampled it.

The scheduler thread is nobody's awaited task, so it is supervised
(:mod:`rl.engines.background`): an exception that ends its loop marks the engine failed
(``engine.fail``: ``/health`` and ``/health_generate`` answer 503), fails every waiting and
running request with :class:`~rl.engines.background.EngineFailedError` (HTTP 503) and refuses
new ones, instead of leaving every caller waiting forever on a live process.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rl.engines import protocol as P
from rl.engines.background import EngineFailedError, supervised_thread
from rl.engines.kvcache import CachedForward, KVCache
from rl.engines.sampling import Generation, finish_reason, sample_token

# The failure ids of docs/failures.md this guard catches (`t1ops explain ID`): a weight load bumps
# ``weights_generation`` and the next iteration drops every cached prefix of the old weights.
CATCHES = {
    "prefix-cache-across-versions": (),
}

_IDLE_POLL_S = 0.05        # how often the idle or paused scheduler re-checks for aborts
MIN_SHARED_PREFIX = 16     # copy another request's K/V only for a shared prefix at least this long


@dataclass
class Sequence:
    """One /generate request inside the scheduler."""

    running: Any                        # the engine's request record (rid, aborted, abort_message)
    params: P.SamplingParams
    generator: torch.Generator
    tokens: list[int]                   # compact ids: prompt, then outputs
    gen: Generation = field(default_factory=Generation)
    slot: int | None = None
    cached: int = 0                     # positions [0, cached) have K/V in the slot
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None            # the scheduler died with this request waiting or running


class SlotPool:
    """Cache slots: running, free, or retained (a finished request's tokens, LRU) for prefix reuse."""

    def __init__(self, cache: KVCache, num_layers: int, topk: int, *, reuse: bool = True) -> None:
        self.cache, self.reuse = cache, reuse  # reuse False: every request prefills its whole prompt
        self.free = list(range(cache.num_slots))[::-1]
        self.retained: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self.rows = [np.zeros((cache.max_seq_len, num_layers, topk), dtype=np.int32) for _ in range(cache.num_slots)]
        self.routed = [0] * cache.num_slots  # positions [0, routed) of a slot have rows
        self.reused_tokens = 0

    def acquire(self, tokens: list[int]) -> tuple[int, int] | None:
        """A slot for ``tokens`` and how many leading positions it already caches; None when full."""
        prompt = np.asarray(tokens)
        best, match = None, 0
        for slot, cached in (self.retained.items() if self.reuse else ()):
            n = _common_prefix(cached, prompt, limit=len(tokens) - 1)  # the last token must be fed
            if n > match:
                best, match = slot, n
        if best is not None and match == len(self.retained[best]):  # the request extends it: take it over
            del self.retained[best]
            self.reused_tokens += match
            return best, match
        if not self.free and not self.retained:
            return None
        slot = self.free.pop() if self.free else self._evict(keep=best)
        if slot is None:
            return None
        if best is not None and match >= MIN_SHARED_PREFIX and self.cache.partial_prefix:
            self.cache.copy_prefix(best, slot, match)
            self.rows[slot][:match] = self.rows[best][:match]
            self.routed[slot] = min(match, self.routed[best])
            self.reused_tokens += match
            return slot, match
        self.routed[slot] = 0
        return slot, 0

    def _evict(self, keep: int | None) -> int | None:
        for slot in self.retained:  # oldest first
            if slot != keep:
                del self.retained[slot]
                return slot
        return None

    def release(self, slot: int, tokens: list[int], cached: int) -> None:
        """A request finished: keep its cached positions for a later request to extend."""
        self.retained[slot] = np.asarray(tokens[:cached])

    def drop_retained(self) -> None:
        self.free.extend(self.retained)
        self.retained.clear()

    def usage(self) -> float:
        """The share of the cache's slots running requests hold. A slot is this cache's unit of allocation
        (``max_seq_len`` positions, as a page is SGLang's); retained prefixes are evictable on demand, as
        SGLang's radix cache, so they do not count. At 1.0 a new request waits for a slot."""
        held = self.cache.num_slots - len(self.free) - len(self.retained)
        return held / self.cache.num_slots


def _common_prefix(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class BatchScheduler:
    """Runs every request's forward passes on one thread; ``run`` blocks its caller until done.

    ``engine`` provides ``model_lock``, ``running_event``, ``paused``, ``weight_version``,
    ``weights_generation``, ``num_generated_tokens`` (counted up here) and ``vocab``
    (``rl.engines.embedded_engine.EmbeddedEngine``).
    """

    def __init__(self, engine, forward: CachedForward, pool: SlotPool, *, max_batch: int = 64,
                 prefill_tokens: int = 4096, supervised: bool = True,
                 chaos_fail_after: int | None = None, batch_invariant: bool = False) -> None:
        self.engine, self.forward, self.pool = engine, forward, pool
        self.batch_invariant = batch_invariant
        if batch_invariant:  # one request per forward, every prompt prefilled whole (module docstring)
            max_batch, prefill_tokens, pool.reuse = 1, 0, False
        self.max_batch, self.prefill_tokens = max_batch, prefill_tokens
        self._cond = threading.Condition()
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._active: list[Sequence] = []
        self._weights_seen = engine.weights_generation
        self.cache_peak = 0.0  # the highest SlotPool.usage() under the current weights (cache_stats)
        self.num_forwards = 0
        self.dead: str | None = None  # why the loop died (it ends otherwise only at close())
        self._closed = False
        self.chaos_fail_after = chaos_fail_after  # chaos only: raise inside the loop after this many forwards
        self._thread = supervised_thread(self._loop, name="engine-batcher", on_death=self._died, supervised=supervised)

    def run(self, seq: Sequence) -> Generation:
        with self._cond:
            if self.dead is not None:
                raise EngineFailedError(f"engine failed: {self.dead}; it serves no request (restart it)")
            self._waiting.append(seq)
            self._cond.notify()
        seq.done.wait()
        if seq.error is not None:
            raise EngineFailedError(f"engine failed with this request in flight: {seq.error}")
        return seq.gen

    def _died(self, reason: str) -> None:
        """The loop ended: mark the engine failed and fail every request it holds (never left waiting)."""
        fail = getattr(self.engine, "fail", None)
        if fail is not None:
            fail(reason)
        with self._cond:
            self.dead = reason
            stranded = [*self._waiting, *self._active]
            self._waiting.clear()
            self._active = []
        for seq in stranded:
            seq.error = reason
            seq.done.set()

    def close(self, timeout_s: float = 10.0) -> None:
        """End the loop (an in-process engine a test or a chaos scenario built): requests still waiting or
        running fail with "engine closed"; no new one is accepted; the thread is joined."""
        with self._cond:
            self._closed, self.dead = True, self.dead or "engine closed"
            stranded = [*self._waiting, *self._active]
            self._waiting.clear()
            self._active = []
            self._cond.notify_all()
        for seq in stranded:
            seq.error = "engine closed"
            seq.done.set()
        self._thread.join(timeout_s)

    def num_queued(self) -> int:
        with self._cond:
            return len(self._waiting) + len(self._active)

    def cache_stats(self) -> dict[str, float]:
        """K/V cache use for ``/model_info``: ``kv_cache_usage`` now and ``kv_cache_peak`` since the current
        weights loaded (a weight sync starts the next window), each a share of the slots; the run-health
        alarm health.kv-cache reads the peak (t1ops/guards/run_health.py)."""
        return {"kv_cache_usage": round(self.pool.usage(), 4), "kv_cache_peak": round(self.cache_peak, 4),
                "kv_cache_slots": self.pool.cache.num_slots}  # read without the model lock: a forward holds it

    def flush(self) -> None:
        """Drop the retained prefixes (``/flush_cache``); running requests keep theirs."""
        with self.engine.model_lock:
            self.pool.drop_retained()

    # --- the loop -------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)  # per thread
        while not self._closed:
            with self._cond:
                self._cond.wait_for(lambda: self._waiting or self._active or self._closed, timeout=_IDLE_POLL_S)
            self._finish_aborted()
            if not self.engine.running_event.wait(timeout=_IDLE_POLL_S):
                continue
            finished: list[Sequence] = []
            with self.engine.model_lock:
                if self.engine.paused:
                    continue
                self._on_new_weights()
                self._admit()
                self._step(finished)
            for seq in finished:
                seq.done.set()

    def _finish_aborted(self) -> None:
        with self._cond:
            gone = [s for s in [*self._waiting, *self._active] if s.running.aborted]
            if not gone:
                return
            self._waiting = collections.deque(s for s in self._waiting if not s.running.aborted)
            self._active = [s for s in self._active if not s.running.aborted]
        with self.engine.model_lock:
            for seq in gone:
                seq.gen.finish = P.FinishReason(type="abort", message=seq.running.abort_message, status_code=503)
                self._release(seq)
                if not seq.gen.output_compact:
                    seq.gen.rows = []  # nothing sampled: no rows, as when no step ran
        for seq in gone:
            seq.done.set()

    def _on_new_weights(self) -> None:
        if self.engine.weights_generation == self._weights_seen:
            return
        self._weights_seen = self.engine.weights_generation
        self.cache_peak = self.pool.usage()  # a new window: the peak under these weights
        self.pool.drop_retained()
        for seq in self._active:  # cached K/V came from the old weights: recompute under the new
            seq.cached = 0

    def _admit(self) -> None:
        with self._cond:
            while self._waiting:
                got = self.pool.acquire(self._waiting[0].tokens)
                if got is None:
                    return  # every slot runs a request: wait for one to finish
                seq = self._waiting.popleft()
                seq.slot, seq.cached = got
                self._active.append(seq)
            self.cache_peak = max(self.cache_peak, self.pool.usage())

    def _step(self, finished: list[Sequence]) -> None:
        if self.chaos_fail_after is not None and self.num_forwards >= self.chaos_fail_after:
            raise RuntimeError(f"chaos: batch scheduler raised after {self.num_forwards} forwards")
        with self._cond:
            active = list(self._active)
        prefill = [s for s in active if len(s.tokens) - s.cached > 1]
        decode = [s for s in active if len(s.tokens) - s.cached == 1]
        for group in _prefill_groups(prefill, self.prefill_tokens):
            self._forward(group, finished)
        for start in range(0, len(decode), self.max_batch):
            self._forward(decode[start:start + self.max_batch], finished)
        if finished:
            with self._cond:
                self._active = [s for s in self._active if s.gen.finish is None]

    def _forward(self, seqs: list[Sequence], finished: list[Sequence]) -> None:
        out = self.forward.forward([s.slot for s in seqs], [s.cached for s in seqs],
                                   [s.tokens[s.cached:] for s in seqs])
        self.num_forwards += 1
        version = self.engine.weight_version
        for b, seq in enumerate(seqs):
            routed = self.pool.routed[seq.slot]
            if routed < len(seq.tokens):  # a row comes from the forward that first fed its position
                fed_from = max(routed, seq.cached)
                self.pool.rows[seq.slot][fed_from:len(seq.tokens)] = out.rows[b][fed_from - seq.cached:]
                self.pool.routed[seq.slot] = len(seq.tokens)
            seq.cached = len(seq.tokens)
            token, logprob = sample_token(out.logits_BV[b], seq.params, seq.generator)
            seq.tokens.append(token)
            seq.gen.output_compact.append(token)
            seq.gen.logprobs.append(logprob)
            seq.gen.versions.append(version)
            self.engine.num_generated_tokens += 1
            seq.gen.finish = finish_reason(self.engine.vocab.decode([token])[0], len(seq.gen.output_compact),
                                           seq.params)
            if seq.gen.finish is not None:
                self._release(seq)
                finished.append(seq)

    def _release(self, seq: Sequence) -> None:
        """Hand the routing rows to the response and keep the slot's prefix for reuse (model lock held)."""
        if seq.slot is None:
            return
        fed = min(self.pool.routed[seq.slot], seq.cached)
        seq.gen.rows = self.pool.rows[seq.slot][:fed].copy()
        self.pool.release(seq.slot, seq.tokens, seq.cached)
        seq.slot = None


def _prefill_groups(seqs: list[Sequence], budget: int) -> list[list[Sequence]]:
    """Group prefills so that a group's padded size (count x longest) stays within ``budget`` positions."""
    groups: list[list[Sequence]] = []
    for seq in sorted(seqs, key=lambda s: len(s.tokens) - s.cached):
        new = len(seq.tokens) - seq.cached
        if groups and (len(groups[-1]) + 1) * new <= budget:
            groups[-1].append(seq)
        else:
            groups.append([seq])
    return groups
