"""`t1ops model`: write a small random checkpoint through transformers (`init`), check one (`check`)."""
from __future__ import annotations

import argparse
import math

NAME = "model"
HELP = "write a small random Hugging Face checkpoint (init) or check a checkpoint directory (check)"
DESCRIPTION = (
    "init writes OUT in the library's own format: the model is built by transformers "
    "(Qwen3_5MoeForCausalLM or Qwen3MoeForCausalLM), initialised by it and saved with its "
    "save_pretrained, with the Qwen3.5 tokenizer files when the vocabulary is the tokenizer's (248,320). "
    "A campaign starts from it with [model] path = OUT (examples/tiny/campaign-qwen35.toml). "
    "check reads a directory as `t1ops run` would (config.json, every shard, every tensor's shape and "
    "dtype, the tokenizer against vocab_size) and prints the model it holds. See docs/model.md."
)

QWEN35_TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                   linear_conv_kernel_dim=4, rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                              "partial_rotary_factor": 0.25})
QWEN3_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                  norm_topk_prob=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    init = sub.add_parser("init", help="write a small random checkpoint through transformers' save_pretrained")
    init.add_argument("--arch", choices=["qwen3_5_moe", "qwen3_moe"], default="qwen3_5_moe",
                      help="qwen3_5_moe: the documents' hybrid (3 GatedDeltaNet layers per gated attention layer, "
                           "shared expert); qwen3_moe: every layer attention")
    init.add_argument("--out", required=True, metavar="DIR", help="output directory (must not exist or be empty)")
    init.add_argument("--layers", type=int, default=None, help="layers (default 4 for qwen3_5_moe, 2 for qwen3_moe)")
    init.add_argument("--max-seq-len", type=int, default=1024, help="max_position_embeddings")
    init.add_argument("--vocab-size", type=int, default=248_320,
                      help="vocabulary (default: the Qwen3.5 tokenizer's, whose files are written beside)")
    init.add_argument("--seed", type=int, default=0)
    check = sub.add_parser("check", help="check a checkpoint directory as `t1ops run` reads it")
    check.add_argument("path", metavar="DIR")


def init_checkpoint(arch: str, out: str, *, layers: int | None = None, max_seq_len: int = 1024,
                    vocab_size: int = 248_320, seed: int = 0) -> str:
    """Build, initialise and save a tiny model with transformers; returns ``out``."""
    from pathlib import Path

    import torch
    import transformers

    from rl.chat import ENDOFTEXT_ID, IM_END_ID
    from t1ops.errors import ConfigError

    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise ConfigError(f"--out {target} exists and is not empty; give a new directory", key="--out")
    common = dict(vocab_size=vocab_size, max_position_embeddings=max_seq_len, tie_word_embeddings=False)
    if vocab_size > max(IM_END_ID, ENDOFTEXT_ID):  # the tokenizer's special ids exist in this vocabulary
        common.update(eos_token_id=IM_END_ID, pad_token_id=ENDOFTEXT_ID)
    if arch == "qwen3_5_moe":
        n = layers or 4
        types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
        config = transformers.Qwen3_5MoeTextConfig(**{**QWEN35_TINY, **common, "num_hidden_layers": n},
                                                   layer_types=types)
        model_cls = transformers.Qwen3_5MoeForCausalLM
    else:
        config = transformers.Qwen3MoeConfig(**{**QWEN3_TINY, **common, "num_hidden_layers": layers or 2})
        model_cls = transformers.Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    model_cls(config).float().save_pretrained(target)
    if vocab_size == 248_320:
        from rl.hf.tokenizer import write_tokenizer

        write_tokenizer(target)
    return str(target)


def run(args: argparse.Namespace) -> int:
    from rl.hf.layout import hf_shapes
    from rl.hf.reader import HFCheckpoint

    path = args.path if args.action == "check" else init_checkpoint(
        args.arch, args.out, layers=args.layers, max_seq_len=args.max_seq_len, vocab_size=args.vocab_size,
        seed=args.seed)
    ckpt = HFCheckpoint(path)
    spec = ckpt.spec
    params = sum(math.prod(shape) for shape in hf_shapes(spec).values())
    kinds = f", layers {''.join('L' if t == 'linear_attention' else 'A' for t in spec.layer_types)}" \
        if spec.hybrid else ""
    print(f"{'wrote' if args.action == 'init' else 'ok'} {path}: {spec.arch}, {spec.num_layers} layers{kinds}, "
          f"hidden {spec.hidden_size}, {spec.num_experts} experts top-{spec.moe_router_topk}, vocabulary "
          f"{spec.vocab_size}, {params / 1e6:.1f} M parameters; R3 rows {spec.num_moe_layers} x {spec.moe_router_topk} "
          f"= {spec.num_moe_layers * spec.moe_router_topk * 4} bytes per token")
    if ckpt.set_aside:
        print(f"  set aside (not part of the policy): {len(ckpt.set_aside)} tensors, first {ckpt.set_aside[0]}")
    return 0
