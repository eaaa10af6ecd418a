"""The embedded engine's model host: the tiny megatron-core MoE policy, its weights and generation.

:class:`EmbeddedEngine` holds the model, its weight version and the pause/abort state; the HTTP
server in front of it is :mod:`rl.engines.embedded_http`, the process entry points are
:mod:`rl.engines.embedded`. It runs at a different precision from the trainer (bf16 vs fp32 by
default), as SGLang does relative to Megatron, so sampler and trainer log-probs and routing
genuinely differ a little.

Semantics (the parts a caller relies on):

- ids on the wire are tokenizer ids; the model works on compact ids
  (:class:`rl.vocab.CompactVocab`, identity by default).
- Generation runs on a K/V cache with continuous batching and prefix reuse
  across a trajectory's turns (:mod:`rl.engines.batching`, docs/engine.md);
  ``--recompute`` keeps the old path (the whole sequence per token, one
  request at a time) for benchmarks. Routing rows follow SGLang on both:
  prompt rows from the first forward, then each sampled token's row from the
  forward that feeds it; the last token has none.
- ``batch_invariant=True`` (``--batch-invariant``, ``engine.batch_invariant``): each request's
  forwards carry that request alone, with no prefix reuse, so its output is a function of its
  prompt, ``sampling_seed`` and the weights only (docs/determinism.md). The recompute path is
  batch-invariant already.
- ``output_token_logprobs`` are exact log-probs of the engine's own model:
  log-softmax of the logits divided by the temperature (1 when greedy), over
  the real compact ids (UNK excluded), before top-k/top-p truncation.
- Every token step holds the model lock, so a weight update never lands
  inside a step. ``pause_generation`` returns once no step is running; later
  steps wait until ``continue_generation``. ``mode="abort"`` also finishes
  the requests in flight at that moment with ``finish_reason`` abort (their
  partial output is returned; callers resubmit). New requests wait.
- ``update_weights_from_disk`` loads ``<model_path>/weights.pt`` after
  checking ``manifest.json``: role must be ``actor`` and the file sha256 must
  match. The new version is the request's ``weight_version``, else the
  manifest's step. ``meta_info.weight_versions`` lists which output tokens
  came from which version, so a request spanning two is visible.
- a death of the batch scheduler's loop (nobody awaits that thread) is never
  silent (:mod:`rl.engines.background`): :meth:`EmbeddedEngine.fail` records
  it, ``/health`` and ``/health_generate`` answer 503 from then on, and every
  waiting or new ``/generate`` answers 503 naming the cause.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rl.engines import protocol as P
from rl.engines import protocol_control as PC
from rl.engines.background import EngineFailedError
from rl.engines.batching import BatchScheduler, Sequence, SlotPool
from rl.engines.kvcache import CachedForward, KVCache
from rl.engines.sampling import Generation, finish_reason, sample_token
from rl.engines.weight_updates import update_from_hf_dir
from rl.errors import BudgetError, CheckpointError, CheckpointRoleError, InputError
from rl.hf.checkpoint import is_hf_dir
from rl.model import ModelSpec, WEIGHTS_FILE, build_policy, last_logits, load_weights, record_routing
from rl.vocab import CompactVocab

MANIFEST_FILE = "manifest.json"
_PAUSE_POLL_S = 0.05  # how often a waiting request re-checks for an abort while paused
KV_CACHE_BUDGET_BYTES = 1 << 30  # K/V slots are capped to fit this (a larger model gets fewer slots)


# --- weights -----------------------------------------------------------------
def check_actor_checkpoint(model_path: str | Path) -> dict:
    """Return the manifest of an actor checkpoint directory, or raise.

    Refuses a manifest naming another role (CheckpointRoleError: the report's
    critic-overwrites-actor failure would otherwise serve a value head) and a
    weights file whose sha256 differs from the manifest (CheckpointError).
    """
    directory = Path(model_path)
    manifest_path, weights_path = directory / MANIFEST_FILE, directory / WEIGHTS_FILE
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # missing, not UTF-8, not JSON, absurdly nested
        raise CheckpointError(f"cannot read {manifest_path}: {exc}; pass a checkpoint step directory",
                              path=str(directory)) from exc
    role = manifest.get("role") if isinstance(manifest, dict) else None
    if role != "actor":
        raise CheckpointRoleError(
            f"{directory} holds role {role!r}, not 'actor'; an engine serves only the actor's weights",
            path=str(directory), found_role=role)
    expected = manifest.get("file_sha256")
    if not isinstance(expected, str):
        raise CheckpointError(f"{manifest_path} has no file_sha256: the weights cannot be verified; "
                              "write checkpoints with t1ops.guards.checkpoints", path=str(directory))
    digest = hashlib.sha256()
    try:
        with open(weights_path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise CheckpointError(f"cannot read {weights_path}: {exc}", path=str(weights_path)) from exc
    if digest.hexdigest() != expected:
        raise CheckpointError(f"{weights_path} sha256 differs from {manifest_path}: truncated or corrupt",
                              path=str(weights_path))
    return manifest


def round_to_served(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Round every weight to the engine's precision, in place. Megatron keeps some parameters above
    it (norm weights stay fp32 in a bf16 model); a weight sync sends every tensor in the served
    dtype (``rl.weights.sender``), so an engine started from a checkpoint (a resume, a recreated
    engine) must hold the same values as one that received the version through a sync, bit for
    bit (docs/determinism.md)."""
    from rl.model import weights_state_dict

    with torch.no_grad():
        for tensor in weights_state_dict(model).values():
            if tensor.is_floating_point() and tensor.dtype != dtype:
                tensor.copy_(tensor.to(dtype))


# --- request state -------------------------------------------------------------
@dataclass
class _Running:
    """One /generate request in flight."""

    rid: str
    aborted: bool = False
    abort_message: str = "Aborted"


class EmbeddedEngine:
    """The model, its version, and the pause/abort state; thread-safe."""

    def __init__(self, spec: ModelSpec, vocab: CompactVocab, dtype: torch.dtype, seed: int,
                 checkpoint: str | None = None, weight_version: str = "default", *, batching: bool = True,
                 kv_slots: int = 128, max_batch: int = 64, supervised: bool = True,
                 chaos_fail_after: int | None = None, batch_invariant: bool = False) -> None:
        if vocab.size != spec.vocab_size:
            raise InputError(f"vocab has {vocab.size} compact ids but spec.vocab_size is {spec.vocab_size}",
                             vocab_size=vocab.size, spec_vocab_size=spec.vocab_size)
        self.spec, self.vocab, self.dtype = spec, vocab, dtype
        self.model = build_policy(spec, seed, dtype=dtype, unk_id=vocab.unk_id)
        self.model.eval()
        self.weight_version = weight_version
        self.emission_log = None  # an rl.engines.emission_log.EmissionLog: every answered request's ids
        self.model_path: str | None = None
        self._model_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._running_event = threading.Event()
        self._running_event.set()
        self._requests: dict[str, _Running] = {}
        self._sampler = torch.Generator().manual_seed(seed)
        self.weights_generation = 0  # bumped by every weight load: cached K/V of older weights is stale
        self.num_generated_tokens = 0  # every token sampled so far, all requests (``/model_info``)
        self.model_lock, self.running_event = self._model_lock, self._running_event  # for the scheduler
        self.scheduler: BatchScheduler | None = None
        self.chaos_omit_routing: re.Pattern | None = None  # chaos mode only (--chaos-omit-routing-for)
        self.chaos_drop_continue = False  # chaos mode only (--chaos-drop-continue): acknowledge, stay paused
        self.failed: str | None = None  # why the engine can serve nothing any more (a background loop died)
        if batching:  # KV cache + continuous batching (docs/engine.md); else recompute per token
            per_slot = KVCache.bytes_per_slot(self.model, spec.max_seq_len)
            num_slots = max(1, min(kv_slots, KV_CACHE_BUDGET_BYTES // per_slot))
            if num_slots < kv_slots:
                print(f"embedded engine: {num_slots} K/V slots of {per_slot / 2**20:.1f} MiB fit the "
                      f"{KV_CACHE_BUDGET_BYTES >> 20} MiB cache budget ({kv_slots} asked)", flush=True)
            cache = KVCache(self.model, num_slots, spec.max_seq_len)
            self.scheduler = BatchScheduler(self, CachedForward(self.model, cache),
                                            SlotPool(cache, spec.num_layers, spec.moe_router_topk), max_batch=max_batch,
                                            supervised=supervised, chaos_fail_after=chaos_fail_after,
                                            batch_invariant=batch_invariant)
        if checkpoint is not None:
            self.update_weights(PC.UpdateWeightsFromDiskRequest(model_path=checkpoint, weight_version=None))

    # --- control ----------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return not self._running_event.is_set()

    def pause(self, mode: str) -> None:
        """Stop generation between tokens; ``abort`` also finishes the requests in flight."""
        with self._state_lock:
            self._running_event.clear()
            if mode == "abort":
                for running in self._requests.values():
                    running.aborted, running.abort_message = True, "Aborted by pause_generation"
        with self._model_lock:  # returns once the step in progress (if any) has finished
            pass

    def resume(self) -> None:
        if self.chaos_drop_continue:  # the fault of chaos/scenarios/engine_left_paused.py: the continue is lost
            print("chaos: continue_generation acknowledged and dropped; the engine stays paused", flush=True)
            return
        self._running_event.set()

    def fail(self, reason: str) -> None:
        """A background loop died: from now on health checks answer 503 naming ``reason``."""
        self.failed = reason

    def abort(self, rid: str, abort_all: bool) -> int:
        with self._state_lock:
            targets = list(self._requests.values()) if abort_all else [self._requests[rid]] if rid in self._requests else []
            for running in targets:
                running.aborted, running.abort_message = True, "Aborted by abort_request"
        return len(targets)

    def close(self) -> None:
        """Stop the batch scheduler's thread (an engine built in-process; a served engine ends with its process)."""
        if self.scheduler is not None:
            self.scheduler.close()

    def num_running(self) -> int:
        with self._state_lock:
            return len(self._requests)

    def update_weights(self, request: PC.UpdateWeightsFromDiskRequest) -> None:
        if is_hf_dir(request.model_path):  # a Hugging Face export (what SGLang loads): rl.engines.weight_updates
            return update_from_hf_dir(self, request)
        manifest = check_actor_checkpoint(request.model_path)
        if request.abort_all_requests:
            self.abort("", abort_all=True)
        with self._model_lock:
            load_weights(self.model, request.model_path)
            round_to_served(self.model, self.dtype)
            self.weights_generation += 1
            self.weight_version = request.weight_version or str(manifest.get("step", self.weight_version))
            self.model_path = str(request.model_path)

    def set_version(self, new_version: str, abort_all: bool) -> None:
        if abort_all:
            self.abort("", abort_all=True)
        with self._model_lock:
            self.weight_version = new_version

    # --- generation -------------------------------------------------------------
    def generate(self, request: P.GenerateRequest) -> P.GenerateResponse:
        params = request.sampling_params
        num_prompt = len(request.input_ids)
        if num_prompt + params.max_new_tokens > self.spec.max_seq_len:
            raise BudgetError(
                f"prompt ({num_prompt}) + max_new_tokens ({params.max_new_tokens}) exceeds the "
                f"context window ({self.spec.max_seq_len}); shorten the prompt or lower max_new_tokens",
                num_prompt_tokens=num_prompt, max_new_tokens=params.max_new_tokens)
        prompt_compact = self.vocab.encode_inputs(request.input_ids)
        running = _Running(rid=request.rid or uuid.uuid4().hex)
        with self._state_lock:
            self._requests[running.rid] = running
        try:
            if self.scheduler is not None:
                gen = self.scheduler.run(Sequence(running, params, self._generator(params), list(prompt_compact)))
            else:
                gen = self._generate_loop(prompt_compact, params, running)
        finally:
            with self._state_lock:
                self._requests.pop(running.rid, None)
        resp = self._response(request, running.rid, gen)
        if self.emission_log is not None:  # the engine's own record, for the audit (rl.engines.emission_log)
            self.emission_log.record(running.rid, resp.output_ids, self.weight_version, resp.finish_reason.type)
        return resp

    def _generator(self, params: P.SamplingParams) -> torch.Generator:
        return self._sampler if params.sampling_seed is None else torch.Generator().manual_seed(params.sampling_seed)

    def _generate_loop(self, prompt_compact: list[int], params: P.SamplingParams, running: _Running) -> Generation:
        """The recompute path (``batching=False``): the whole sequence per token, one request at a time."""
        gen = Generation()
        generator = self._generator(params)
        while gen.finish is None:
            if running.aborted:
                gen.finish = P.FinishReason(type="abort", message=running.abort_message, status_code=503)
                break
            if not self._running_event.wait(timeout=_PAUSE_POLL_S):
                continue
            with self._model_lock:
                if self.paused or running.aborted:
                    continue
                self._step(prompt_compact, params, generator, gen)
            gen.finish = finish_reason(self.vocab.decode(gen.output_compact[-1:])[0], len(gen.output_compact), params)
        return gen

    def _step(self, prompt_compact: list[int], params: P.SamplingParams, generator: torch.Generator,
              gen: Generation) -> None:
        """One token: forward (last position only), record routing, sample; caller holds the model lock."""
        ids_1T = torch.tensor([prompt_compact + gen.output_compact], dtype=torch.long)
        with torch.no_grad(), record_routing(self.model) as record:
            logits_V = last_logits(self.model, ids_1T)[0]
        rows_TLK = record.rows[0]
        gen.rows.extend(rows_TLK if not gen.rows else rows_TLK[-1:])
        token, logprob = sample_token(logits_V, params, generator)
        gen.output_compact.append(token)
        gen.logprobs.append(logprob)
        gen.versions.append(self.weight_version)
        self.num_generated_tokens += 1

    def _response(self, request: P.GenerateRequest, rid: str, gen: Generation) -> P.GenerateResponse:
        output_ids = tuple(self.vocab.decode(gen.output_compact))
        routing = None
        if request.return_routed_experts and len(gen.rows):
            end = len(request.input_ids) + len(output_ids) - 1
            rows = gen.rows[request.routed_experts_start_len:end]  # an array (batched) or a list of rows
            routing = (rows if isinstance(rows, np.ndarray) else np.stack(rows)).astype(np.int32, copy=False)
            if self.chaos_omit_routing is not None and self.chaos_omit_routing.search(rid):
                print(f"chaos: omitted meta_info.routed_experts for rid {rid}", flush=True)  # the fault's evidence
                routing = None
        return P.GenerateResponse(
            output_ids=output_ids, finish_reason=gen.finish, weight_version=self.weight_version,
            prompt_tokens=len(request.input_ids), completion_tokens=len(output_ids), rid=rid,
            output_token_logprobs=tuple(gen.logprobs) if request.return_logprob else None,
            routed_experts_RLK=routing, weight_versions=_version_spans(gen.versions))

    def health_generate(self) -> None:
        """One forward of one token under the model lock (does not wait for a pause); raises
        :class:`~rl.engines.background.EngineFailedError` once the engine has failed."""
        if self.failed is not None:
            raise EngineFailedError(f"engine failed: {self.failed}")
        with self._model_lock, torch.no_grad():
            last_logits(self.model, torch.zeros(1, 1, dtype=torch.long))


def _version_spans(versions: list[str]) -> tuple[P.WeightVersionSpan, ...]:
    spans: list[P.WeightVersionSpan] = []
    for index, version in enumerate(versions):
        if spans and spans[-1].version == version:
            spans[-1] = P.WeightVersionSpan(version, spans[-1].start, index + 1)
        else:
            spans.append(P.WeightVersionSpan(version, index, index + 1))
    return tuple(spans)
