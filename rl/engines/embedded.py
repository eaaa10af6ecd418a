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

The pieces: the model host :mod:`rl.engines.embedded_engine` (semantics a caller relies on:
its docstring), the HTTP server :mod:`rl.engines.embedded_http`; this module holds the process
entry points: the serve flags, :func:`build_engine`, :func:`serve` and ``main``
(:func:`rl.engines.embedded_spawn.spawn` starts this process and waits for its health).
"""
from __future__ import annotations

import argparse
import errno
import json
import re
import sys
from http.server import ThreadingHTTPServer

import torch

from rl.engines.ports import PORT_TAKEN_EXIT
from rl.engines.embedded_engine import EmbeddedEngine
from rl.engines.embedded_http import make_handler
from rl.errors import InputError
from rl.model import ModelSpec
from rl.vocab import CompactVocab

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}


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
    parser.add_argument("--batch-invariant", action="store_true",
                        help="Each forward carries one request, no prefix reuse: a request's tokens do not depend "
                             "on what it was batched with (docs/determinism.md).")
    parser.add_argument("--chaos", action="store_true",
                        help="Chaos mode: allow the --chaos-* fault switches (never in a campaign).")
    parser.add_argument("--chaos-omit-routing-for", default=None, metavar="RID_REGEX",
                        help="Chaos mode only: answer requests whose rid matches without routed_experts.")
    parser.add_argument("--chaos-drop-continue", action="store_true",
                        help="Chaos mode only: acknowledge /continue_generation and stay paused (engine-left-paused).")
    parser.add_argument("--chaos-corrupt-weight-bucket", type=int, action="append", default=None, metavar="N",
                        help="Chaos mode only: reorder two tensors of the N-th weight bucket this engine receives "
                             "(weight-sync-corruption); repeat for several.")
    parser.add_argument("--chaos-fail-batcher-after", type=int, default=None, metavar="N",
                        help="Chaos mode only: raise inside the batch scheduler's loop after N forwards "
                             "(swallowed-engine-death).")
    parser.add_argument("--chaos-unsupervised", action="store_true",
                        help="Chaos mode only: run the batch scheduler without its supervisor (its death "
                             "goes unreported, as before the guard).")
    parser.add_argument("--emission-log", default=None, metavar="PATH",
                        help="Append every answered request's emitted ids to PATH (JSON lines; the audit's "
                             "engine-side record, rl/engines/emission_log.py).")
    parser.add_argument("--kv-slots", type=int, default=128,
                        help="K/V cache slots: running requests plus finished ones kept for prefix reuse.")


CHAOS_SWITCHES = ("chaos_omit_routing_for", "chaos_drop_continue", "chaos_corrupt_weight_bucket",
                  "chaos_fail_batcher_after", "chaos_unsupervised")


def build_engine(args: argparse.Namespace, spec: ModelSpec | None = None) -> EmbeddedEngine:
    """An engine from parsed serve flags; ``spec`` overrides ``--spec-json``; ``--model-path`` overrides both."""
    for switch in CHAOS_SWITCHES:  # fault switches of the chaos harness (docs/failures.md)
        if getattr(args, switch, None) not in (None, False) and not getattr(args, "chaos", False):
            flag = "--" + switch.replace("_", "-")
            raise InputError(f"{flag} is a chaos fault switch: add --chaos to start the engine "
                             "in chaos mode (never in a campaign)", argument=flag)
    omit, pattern = getattr(args, "chaos_omit_routing_for", None), None
    if omit is not None:
        try:
            pattern = re.compile(omit)
        except re.error as exc:
            raise InputError(f"--chaos-omit-routing-for {omit!r} is not a regular expression: {exc}",
                             argument="--chaos-omit-routing-for") from exc
    engine = _build_engine(args, spec)
    if getattr(args, "chaos_drop_continue", False):
        engine.chaos_drop_continue = True
    if getattr(args, "chaos_corrupt_weight_bucket", None) is not None:
        engine.chaos_corrupt_buckets = tuple(args.chaos_corrupt_weight_bucket)
    if getattr(args, "chaos", False):
        print(f"embedded engine in CHAOS mode: {[s for s in CHAOS_SWITCHES if getattr(args, s, None)]}", flush=True)
    if getattr(args, "emission_log", None):
        from rl.engines.emission_log import EmissionLog

        engine.emission_log = EmissionLog(args.emission_log, by="engine")
    if pattern is not None:
        engine.chaos_omit_routing = pattern
        print(f"embedded engine in CHAOS mode: routed_experts omitted for rids matching {omit!r}", flush=True)
    return engine


def _build_engine(args: argparse.Namespace, spec: ModelSpec | None) -> EmbeddedEngine:
    if getattr(args, "model_path", None):
        from rl.hf.reader import read_config
        from rl.hf.layout import spec_from_config

        spec = spec_from_config(read_config(args.model_path))
        torch.set_num_threads(max(1, args.num_threads))
        engine = EmbeddedEngine(spec, CompactVocab.identity(spec.vocab_size), DTYPES[args.dtype], args.seed,
                                checkpoint=args.model_path, batching=not args.recompute, kv_slots=max(1, args.kv_slots),
                                batch_invariant=getattr(args, "batch_invariant", False))
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
                          batching=not args.recompute, kv_slots=max(1, args.kv_slots),
                          batch_invariant=getattr(args, "batch_invariant", False), **_scheduler_chaos(args))


def _scheduler_chaos(args: argparse.Namespace) -> dict:
    return {"supervised": not getattr(args, "chaos_unsupervised", False),
            "chaos_fail_after": getattr(args, "chaos_fail_batcher_after", None)}


def serve(engine: EmbeddedEngine, host: str, port: int) -> None:
    """Serve until interrupted (blocking)."""
    server = ThreadingHTTPServer((host, port), make_handler(engine))
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
    engine = build_engine(args)
    try:
        serve(engine, args.host, args.port)
    except OSError as e:   # another process took the port between its probe and this bind
        if e.errno != errno.EADDRINUSE:
            raise
        print(f"embedded engine: port {args.port} is taken ({e}); exit {PORT_TAKEN_EXIT} so the "
              "launcher starts it again on a fresh port", file=sys.stderr, flush=True)
        return PORT_TAKEN_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
