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


def run(args: argparse.Namespace) -> int:
    from rl.engines.embedded import build_engine, serve
    from rl.model import ModelSpec
    from t1ops.config import load_toml

    spec = None
    if args.spec_json is None and args.config is not None:
        spec = ModelSpec.from_config(load_toml(args.config).model)
    elif args.spec_json is not None:
        spec = ModelSpec(**json.loads(args.spec_json))
    serve(build_engine(args, spec=spec), args.host, args.port)
    return 0
