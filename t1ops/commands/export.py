"""`t1ops export`: write an actor checkpoint as a Hugging Face Qwen3-MoE directory."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "export"
HELP = "export an actor checkpoint in Hugging Face layout (config.json + safetensors + tokenizer)"
DESCRIPTION = (
    "Reads CHECKPOINT_DIR (a t1ops actor step directory, verified: weights.pt + manifest.json, or one "
    "file per trainer rank + manifest.json), finds the model shape in the run's config.json (or "
    "--config), and writes OUT_DIR in the layout transformers' AutoModelForCausalLM.from_pretrained and "
    "SGLang's --model-path load, streaming: each tensor is assembled from the shards and written in "
    "turn, so the export holds about one tensor, not the model. A critic checkpoint is refused. See "
    "docs/weights.md."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="actor step directory, e.g. "
                   "runs/<run>/checkpoints/actor/step_00000004")
    p.add_argument("--hf", required=True, metavar="OUT_DIR", help="output directory (must not exist or be empty)")
    p.add_argument("--config", default=None, help="campaign TOML or a run's config.json (default: the run directory's "
                   "config.json, three levels above CHECKPOINT_DIR)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="tensor dtype of the export")


def run(args: argparse.Namespace) -> int:
    from t1ops.export import export_actor_checkpoint

    out = export_actor_checkpoint(args.checkpoint_dir, args.hf, config=args.config, dtype=args.dtype)
    meta = json.loads((Path(out) / "t1ops.json").read_text())
    print(f"exported {args.checkpoint_dir} (step {meta.get('step')}, vocabulary {meta.get('vocab')}) to {out}")
    return 0
