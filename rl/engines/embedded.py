"""The embedded engine: the tiny megatron-core MoE model behind SGLang's HTTP API.

A laptop has no SGLang, so this process serves the same endpoints (schema in
:mod:`rl.engines.protocol`) from :mod:`rl.model` on CPU, so campaigns run the
same client code everywhere. It runs at a different precision from the
trainer (bf16 vs fp32 by default), as SGLang does relative to Megatron, so
sampler and trainer log-probs and routing genuinely differ a little.

Endpoints: ``POST /generate``, ``GET /health``, ``GET /health_generate``,
``POST /pause_generation``, ``POST /continue_generation``,
``POST /update_weights_from_disk``, ``POST /update_weight_version``,
``POST /abort_request``, ``POST /flush_cache``, ``GET /model_info`` and
``GET /get_weight_version``.

Semantics (the parts a caller relies on):

- ids on the wire are tokenizer ids; the model works on compact ids
  (:class:`rl.vocab.CompactVocab`, identity by default).
- Generation runs on a K/V cache with continuous batching and prefix reuse
  across a trajectory's turns (:mod:`rl.engines.batching`, docs/engine.md);
  ``--recompute`` keeps the old path (the whole sequence per token, one
  request at a time) for benchmarks. Routing rows follow SGLang on both:
  prompt rows from the first forward, then each sampled token's row from the
  forward that feeds it; the last token has none.
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
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from rl.engines import protocol as P
from rl.engines import protocol_control as PC
from rl.engines import weight_updates
from rl.engines.weight_updates import update_from_hf_dir
from rl.hf.checkpoint import is_hf_dir
from rl.errors import BudgetError, CheckpointError, CheckpointRoleError, EngineError, InputError, ParseError, T1OpsError
from rl.engines.batching import BatchScheduler, Sequence, SlotPool
from rl.engines.kvcache import CachedForward, KVCache
from rl.engines.sampling import Generation, finish_reason, sample_token
from rl.model import ModelSpec, WEIGHTS_FILE, build_policy, last_logits, load_weights, record_routing
from rl.vocab import CompactVocab

MANIFEST_FILE = "manifest.json"
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}
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
                 kv_slots: int = 128, max_batch: int = 64) -> None:
        if vocab.size != spec.vocab_size:
            raise InputError(f"vocab has {vocab.size} compact ids but spec.vocab_size is {spec.vocab_size}",
                             vocab_size=vocab.size, spec_vocab_size=spec.vocab_size)
        self.spec, self.vocab, self.dtype = spec, vocab, dtype
        self.model = build_policy(spec, seed, dtype=dtype, unk_id=vocab.unk_id)
        self.model.eval()
        self.weight_version = weight_version
        self.model_path: str | None = None
        self._model_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._running_event = threading.Event()
        self._running_event.set()
        self._requests: dict[str, _Running] = {}
        self._sampler = torch.Generator().manual_seed(seed)
        self.weights_generation = 0  # bumped by every weight load: cached K/V of older weights is stale
        self.model_lock, self.running_event = self._model_lock, self._running_event  # for the scheduler
        self.scheduler: BatchScheduler | None = None
        self.chaos_omit_routing: re.Pattern | None = None  # chaos mode only (--chaos-omit-routing-for)
        if batching:  # KV cache + continuous batching (docs/engine.md); else recompute per token
            per_slot = KVCache.bytes_per_slot(self.model, spec.max_seq_len)
            num_slots = max(1, min(kv_slots, KV_CACHE_BUDGET_BYTES // per_slot))
            if num_slots < kv_slots:
                print(f"embedded engine: {num_slots} K/V slots of {per_slot / 2**20:.1f} MiB fit the "
                      f"{KV_CACHE_BUDGET_BYTES >> 20} MiB cache budget ({kv_slots} asked)", flush=True)
            cache = KVCache(self.model, num_slots, spec.max_seq_len)
            self.scheduler = BatchScheduler(self, CachedForward(self.model, cache),
                                            SlotPool(cache, spec.num_layers, spec.moe_router_topk), max_batch=max_batch)
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
        self._running_event.set()

    def abort(self, rid: str, abort_all: bool) -> int:
        with self._state_lock:
            targets = list(self._requests.values()) if abort_all else [self._requests[rid]] if rid in self._requests else []
            for running in targets:
                running.aborted, running.abort_message = True, "Aborted by abort_request"
        return len(targets)

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
        return self._response(request, running.rid, gen)

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
        """One forward of one token under the model lock (does not wait for a pause)."""
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


# --- HTTP ----------------------------------------------------------------------
#: Endpoints added by other modules: ``(method, path) -> fn(engine, read_body) -> (status, json)``;
#: ``read_body()`` parses the request's JSON body. Register with :func:`route` at import time.
EXTRA_ROUTES: dict[tuple[str, str], Callable[[Any, Callable[[], Any]], tuple[int, Any]]] = {}


def route(method: str, path: str):
    """Decorator adding an endpoint to every engine server, e.g.
    ``@route("POST", "/update_weights_from_tensor") def _update(engine, read_body): ...``."""
    def register(fn):
        EXTRA_ROUTES[(method.upper(), path)] = fn
        return fn
    return register


def _make_handler(engine: EmbeddedEngine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
            return  # one line per request would drown the campaign log

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError as exc:
                raise ParseError(f"bad Content-Length header: {exc}") from exc
            if length < 0:
                raise ParseError(f"bad Content-Length header: {length}")
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw) if raw else {}
            except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, absurdly nested
                raise ParseError(f"request body is not JSON: {exc}") from exc

        def _dispatch(self, routes: dict[str, Callable[[], tuple[int, Any]]]) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                self._send(HTTPStatus.NOT_FOUND, {"error": {"message": f"no route {self.command} {self.path}"}})
                return
            try:
                status, body = route()
            except T1OpsError as exc:
                status, body = HTTPStatus.BAD_REQUEST, {"error": {"message": str(exc), "type": type(exc).__name__}}
            except Exception as exc:  # a server answers 500 and keeps serving; the traceback goes to its log
                traceback.print_exc()
                status, body = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {"message": repr(exc)}}
            self._send(status, body)

        def _extra(self, method: str) -> dict[str, Callable[[], tuple[int, Any]]]:
            return {path: (lambda fn=fn: fn(engine, self._body)) for (m, path), fn in EXTRA_ROUTES.items()
                    if m == method}

        def do_GET(self) -> None:  # noqa: N802 (stdlib name)
            self._dispatch({
                **self._extra("GET"),
                P.HEALTH: lambda: (HTTPStatus.OK, {}),
                P.HEALTH_GENERATE: lambda: _health_generate(engine),
                P.MODEL_INFO: lambda: (HTTPStatus.OK, _model_info(engine)),
                "/get_weight_version": lambda: (HTTPStatus.OK, {"weight_version": engine.weight_version}),
            })

        def do_POST(self) -> None:  # noqa: N802 (stdlib name)
            self._dispatch({
                **self._extra("POST"),
                P.GENERATE: lambda: (HTTPStatus.OK, engine.generate(P.GenerateRequest.from_json(self._body())).to_json()),
                P.PAUSE_GENERATION: lambda: _ok(engine.pause(PC.PauseGenerationRequest.from_json(self._body()).mode)),
                P.CONTINUE_GENERATION: lambda: _continue(engine, self._body()),
                P.ABORT_REQUEST: lambda: _abort(engine, PC.AbortRequest.from_json(self._body())),
                P.FLUSH_CACHE: lambda: _flush(engine),
                P.UPDATE_WEIGHTS_FROM_DISK: lambda: _update_weights(engine, self._body()),
                P.UPDATE_WEIGHT_VERSION: lambda: _update_version(engine, self._body()),
                P.HEALTH_GENERATE: lambda: _health_generate(engine),
                **weight_updates.routes(engine, self._body),  # /init_weights_update_group & co.
            })

    return Handler


def _ok(_: Any = None) -> tuple[int, Any]:
    return HTTPStatus.OK, {"success": True}


def _continue(engine: EmbeddedEngine, body: Any) -> tuple[int, Any]:
    PC.ContinueGenerationRequest.from_json(body)  # validates; torch_empty_cache has no CPU meaning
    engine.resume()
    return _ok()


def _health_generate(engine: EmbeddedEngine) -> tuple[int, Any]:
    engine.health_generate()
    return HTTPStatus.OK, {}


def _model_info(engine: EmbeddedEngine) -> dict:
    info = PC.ModelInfo(weight_version=engine.weight_version, model_path=engine.model_path).to_json()
    info.update(spec=engine.spec.to_dict(), dtype=str(engine.dtype).removeprefix("torch."), engine="embedded",
                num_running_requests=engine.num_running(), is_paused=engine.paused)
    return info


def _abort(engine: EmbeddedEngine, request: PC.AbortRequest) -> tuple[int, Any]:
    return HTTPStatus.OK, {"success": True, "num_aborted": engine.abort(request.rid, request.abort_all)}


def _flush(engine: EmbeddedEngine) -> tuple[int, Any]:
    # SGLang refuses to flush while requests run (HTTP 400); the retained prefixes are the cache.
    if engine.num_running():
        return HTTPStatus.BAD_REQUEST, {"message": "Cache not flushed: requests are running"}
    if engine.scheduler is not None:
        engine.scheduler.flush()
    return HTTPStatus.OK, {"message": "Cache flushed"}


def _update_weights(engine: EmbeddedEngine, body: Any) -> tuple[int, Any]:
    request = PC.UpdateWeightsFromDiskRequest.from_json(body)
    try:
        engine.update_weights(request)
    except (CheckpointError, InputError) as exc:
        return HTTPStatus.BAD_REQUEST, PC.UpdateWeightsFromDiskResponse(False, str(exc)).to_json()
    message = f"loaded {request.model_path} as weight version {engine.weight_version}"
    return HTTPStatus.OK, PC.UpdateWeightsFromDiskResponse(True, message).to_json()


def _update_version(engine: EmbeddedEngine, body: Any) -> tuple[int, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("new_version"), str):
        raise ParseError("update_weight_version: body needs a string 'new_version'", field="new_version")
    engine.set_version(body["new_version"], bool(body.get("abort_all_requests", False)))
    return HTTPStatus.OK, {"success": True, "message": f"weight version set to {body['new_version']}"}


# --- process entry points ----------------------------------------------------------
def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The serve flags, shared by ``python -m rl.engines.embedded`` and ``t1ops engine serve``."""
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind (loopback by default).")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on.")
    parser.add_argument("--spec-json", default=None, help="ModelSpec fields as JSON (defaults: rl.model.ModelSpec).")
    parser.add_argument("--vocab", default=None, help="CompactVocab JSON file (default: identity over vocab_size).")
    parser.add_argument("--checkpoint", default=None, help="Actor checkpoint dir (weights.pt + manifest.json).")
    parser.add_argument("--model-path", default=None, help="Hugging Face Qwen3-MoE dir (as SGLang's --model-path): "
                        "shape from its config.json, full vocabulary, weights loaded; replaces --spec-json/--checkpoint.")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="Engine precision (trainer runs fp32).")
    parser.add_argument("--seed", type=int, default=0, help="Init seed (no checkpoint) and sampler seed.")
    parser.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads (CPU is shared).")
    parser.add_argument("--recompute", action="store_true",
                        help="Recompute the whole sequence per token, one request at a time (no K/V cache).")
    parser.add_argument("--chaos", action="store_true",
                        help="Chaos mode: allow the --chaos-* fault switches (never in a campaign).")
    parser.add_argument("--chaos-omit-routing-for", default=None, metavar="RID_REGEX",
                        help="Chaos mode only: answer requests whose rid matches without routed_experts.")
    parser.add_argument("--kv-slots", type=int, default=128,
                        help="K/V cache slots: running requests plus finished ones kept for prefix reuse.")


def build_engine(args: argparse.Namespace, spec: ModelSpec | None = None) -> EmbeddedEngine:
    """An engine from parsed serve flags; ``spec`` overrides ``--spec-json``; ``--model-path`` overrides both."""
    omit, pattern = getattr(args, "chaos_omit_routing_for", None), None
    if omit is not None:  # a fault switch for the chaos harness (docs/failures.md, missing-routing)
        if not getattr(args, "chaos", False):
            raise InputError("--chaos-omit-routing-for is a chaos fault switch: add --chaos to start the engine "
                             "in chaos mode (never in a campaign)", argument="--chaos-omit-routing-for")
        try:
            pattern = re.compile(omit)
        except re.error as exc:
            raise InputError(f"--chaos-omit-routing-for {omit!r} is not a regular expression: {exc}",
                             argument="--chaos-omit-routing-for") from exc
    engine = _build_engine(args, spec)
    if pattern is not None:
        engine.chaos_omit_routing = pattern
        print(f"embedded engine in CHAOS mode: routed_experts omitted for rids matching {omit!r}", flush=True)
    return engine


def _build_engine(args: argparse.Namespace, spec: ModelSpec | None) -> EmbeddedEngine:
    if getattr(args, "model_path", None):
        from rl.hf.checkpoint import read_config
        from rl.hf.qwen3_moe import spec_from_config

        spec = spec_from_config(read_config(args.model_path))
        torch.set_num_threads(max(1, args.num_threads))
        engine = EmbeddedEngine(spec, CompactVocab.identity(spec.vocab_size), DTYPES[args.dtype], args.seed,
                                checkpoint=args.model_path, batching=not args.recompute, kv_slots=max(1, args.kv_slots))
        engine.weight_version = "default"  # as SGLang started with --model-path (its --weight-version default)
        return engine
    if spec is None:
        try:
            spec = ModelSpec(**json.loads(args.spec_json)) if args.spec_json else ModelSpec()
        except (json.JSONDecodeError, TypeError) as exc:
            raise InputError(f"--spec-json is not a ModelSpec: {exc}", argument="--spec-json") from exc
    vocab = CompactVocab.load(args.vocab) if args.vocab else CompactVocab.identity(spec.vocab_size)
    torch.set_num_threads(max(1, args.num_threads))
    return EmbeddedEngine(spec, vocab, DTYPES[args.dtype], args.seed, checkpoint=args.checkpoint,
                          batching=not args.recompute, kv_slots=max(1, args.kv_slots))


def serve(engine: EmbeddedEngine, host: str, port: int) -> None:
    """Serve until interrupted (blocking)."""
    server = ThreadingHTTPServer((host, port), _make_handler(engine))
    server.daemon_threads = True
    print(f"embedded engine ready on http://{host}:{server.server_address[1]} "
          f"(dtype {engine.dtype}, weight_version {engine.weight_version})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.engines.embedded", description=__doc__.split("\n")[0])
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    serve(build_engine(args), args.host, args.port)
    return 0


def spawn(port: int, spec: ModelSpec, *, checkpoint: str | Path | None = None, vocab_path: str | Path | None = None,
          dtype: str = "bf16", seed: int = 0, host: str = "127.0.0.1", startup_timeout_s: float = 180.0,
          log_path: str | Path | None = None, batching: bool = True,
          extra_args: list[str] | None = None) -> subprocess.Popen:
    """Start an engine process and return it once ``GET /health`` answers 200.

    The process's base URL is set as ``proc.url``. Output goes to
    ``log_path`` (else discarded). ``extra_args`` are more serve flags (e.g. the chaos
    harness's ``--chaos --chaos-omit-routing-for RID_REGEX``). Raises EngineError (and kills the child)
    if it exits or stays unhealthy past ``startup_timeout_s``.
    """
    command = [sys.executable, "-m", "rl.engines.embedded", "--host", host, "--port", str(port),
               "--spec-json", json.dumps(spec.to_dict()), "--dtype", dtype, "--seed", str(seed)]
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    if vocab_path is not None:
        command += ["--vocab", str(vocab_path)]
    if not batching:
        command.append("--recompute")
    command += list(extra_args or [])
    log = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[2])
    finally:
        if log_path is not None:
            log.close()  # the child holds its own descriptor
    proc.url = f"http://{host}:{port}"
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineError(f"embedded engine on port {port} exited with {proc.returncode} during startup"
                              + (f"; see {log_path}" if log_path else ""), port=port, returncode=proc.returncode)
        try:
            with urllib.request.urlopen(proc.url + P.HEALTH, timeout=2.0) as resp:
                if resp.status == 200:
                    return proc
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise EngineError(f"embedded engine on port {port} not healthy after {startup_timeout_s} s", port=port,
                      startup_timeout_s=startup_timeout_s)


if __name__ == "__main__":
    sys.exit(main())
