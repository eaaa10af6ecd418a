"""`t1ops engine serve`: run the embedded CPU engine behind SGLang's HTTP API."""
from __future__ import annotations

import argparse
import json

NAME = "engine"
HELP = "run the embedded engine (tiny megatron-core MoE on CPU, SGLang endpoints)"
DESCRIPTION = (
    "serve: load the tiny model at the engine precision (bf16 by default; the trainer runs fp32) "
    "and serve /generate, /health, /health_generate, /pause_generation, /continue_generation, "
    "/update_weights_from_disk, /abort_request, /flush_cache, /model_info on --host:--port."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Flags mirror rl.engines.embedded.add_serve_arguments; they are declared here
    # so that building the CLI parser does not import torch.
    sub = p.add_subparsers(dest="engine_command", required=True)
    s = sub.add_parser("serve", help="serve until interrupted")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    s.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    s.add_argument("--config", default=None, help="campaign TOML; its [model] section gives the model shape")
    s.add_argument("--spec-json", default=None, help="ModelSpec fields as JSON (overrides --config)")
    s.add_argument("--vocab", default=None, help="CompactVocab JSON (default: identity over vocab_size)")
    s.add_argument("--checkpoint", default=None, help="actor checkpoint dir holding weights.pt + manifest.json")
    s.add_argument("--model-path", default=None, help="Hugging Face Qwen3-MoE directory (t1ops export, or what "
                   "SGLang's --model-path loads): model shape from its config.json, full vocabulary")
    s.add_argument("--dtype", choices=["bf16", "bfloat16", "fp32", "float32"], default="bf16",
                   help="engine precision (the trainer runs fp32)")
    s.add_argument("--seed", type=int, default=0, help="init seed (without --checkpoint) and sampler seed")
    s.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads")
    s.add_argument("--openai", action="store_true",
                   help="serve the OpenAI-compatible /v1/chat/completions on --port instead (one session per "
                        "path prefix /s/<name>/v1 or 'user' field; docs/harness.md)")
    s.add_argument("--dump", default=None, help="with --openai: rewrite each session's trajectory here after "
                   "every turn (t1ops audit reads it)")
    s.add_argument("--max-new-tokens", type=int, default=256, help="with --openai: cap on one reply's tokens")
    s.add_argument("--context-window", type=int, default=None,
                   help="with --openai: prompt + reply cap (default: the model's max_seq_len)")
    s.add_argument("--recompute", action="store_true",
                   help="recompute the whole sequence per token, one request at a time (no K/V cache)")
    s.add_argument("--kv-slots", type=int, default=128,
                   help="K/V cache slots: running requests plus finished ones kept for prefix reuse")
    s.add_argument("--batch-invariant", action="store_true",
                   help="one request per forward, no prefix reuse: a request's tokens do not depend on what it "
                        "is batched with (docs/determinism.md)")


def run(args: argparse.Namespace) -> int:
    from rl.engines.embedded import build_engine, serve
    from rl.model import ModelSpec
    from t1ops.config import load_toml

    spec = None
    if args.spec_json is None and args.config is not None:
        spec = load_toml(args.config).model.model_spec()
    elif args.spec_json is not None:
        spec = ModelSpec(**json.loads(args.spec_json))
    engine = build_engine(args, spec=spec)
    if args.openai:
        from rl.harness.session import SessionLimits
        from rl.harness.standalone import serve_openai

        window = args.context_window or engine.spec.max_seq_len
        limits = SessionLimits(max_new_tokens=min(args.max_new_tokens, window - 1), context_window=window)
        serve_openai(engine, args.host, args.port, limits=limits, dump_dir=args.dump)
        return 0
    serve(engine, args.host, args.port)
    return 0
