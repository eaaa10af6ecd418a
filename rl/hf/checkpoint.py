"""Export / import the policy as a Hugging Face checkpoint directory (Qwen3-MoE or Qwen3.5-MoE).

Layout written by :func:`export_hf` (what ``AutoModelForCausalLM.from_pretrained`` and SGLang's
``--model-path`` / ``/update_weights_from_disk`` read)::

    config.json              Qwen3MoeConfig or Qwen3_5MoeTextConfig (rl.hf.layout.config_dict)
    generation_config.json   eos = <|im_end|>, <|endoftext|>
    model.safetensors        tensors by their Hugging Face names (one file: tiny models)
    tokenizer.json, tokenizer_config.json   (full-vocabulary exports only, rl.hf.tokenizer)
    t1ops.json               role, step, source, vocabulary of the export

A compact-vocabulary policy (the embedded tiny model's option, ``rl.vocab``) is exported
with its compact ``vocab_size`` and the id map in ``t1ops.json``; no tokenizer files, because
its row ``i`` is not tokenizer id ``i``: serve full-vocabulary models to a real server.

Writes are atomic (temp dir + rename). ``import_hf`` reads any such directory back to the
megatron state, bit-exact (``tests/rl/test_hf.py``).
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Mapping

import torch

from rl.atomic import publish_dir
from rl.chat import ENDOFTEXT_ID, IM_END_ID
from rl.errors import CheckpointError, CheckpointRoleError
from rl.hf import layout
from rl.hf.reader import HFCheckpoint
from rl.model import ModelSpec
from rl.vocab import CompactVocab

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
META_FILE = "t1ops.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def is_hf_dir(path: str | Path) -> bool:
    """True when ``path`` holds a Hugging Face checkpoint (``config.json`` + safetensors)."""
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and any(path.glob("*.safetensors"))


def export_hf(state: Mapping[str, torch.Tensor], spec: ModelSpec, out_dir: str | Path, *, dtype: str = "float32",
              meta: dict | None = None, tokenizer: bool = True) -> Path:
    """Write ``state`` (megatron names, ``rl.model.weights_state_dict``) as a Qwen3-MoE directory.

    Streaming: ``state`` is read one conversion unit at a time (``state[name]``; a lazy checkpoint
    reader assembles each tensor from its shards when asked) and each Hugging Face tensor is written
    as soon as it is converted (:func:`write_safetensors`), so the export holds about one tensor, not
    the model. ``meta`` goes to ``t1ops.json`` (role, step, vocabulary...); ``tokenizer`` adds the
    tokenizer files. ``out_dir`` must not exist or be empty (an export is never merged into another).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise CheckpointError(f"{out_dir} exists and is not empty; export into a new directory", path=str(out_dir))
    if dtype not in DTYPES:
        raise CheckpointError(f"export dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    layout.check_names(state, spec)
    units = layout.units(spec)

    def tensors():
        for unit in units:
            for name, t in zip(unit.hf, unit.split(state[unit.mcore])):
                yield name, t.detach().to("cpu", DTYPES[dtype]).contiguous()

    shapes = layout.hf_shapes(spec)

    def weights(tmp: Path) -> list[dict[str, str]]:
        write_safetensors(tmp / WEIGHTS_FILE, {n: shapes[n] for u in units for n in u.hf}, DTYPES[dtype], tensors())
        return [{n: WEIGHTS_FILE for u in units for n in u.hf}]

    return export_hf_parts(out_dir, spec, dtype, weights, meta=meta, tokenizer=tokenizer)


def part_file(part: int, num_parts: int) -> str:
    """The safetensors file of part ``part`` of ``num_parts`` (Hugging Face's sharded naming; one part:
    ``model.safetensors``)."""
    return WEIGHTS_FILE if num_parts == 1 else f"model-{part + 1:05d}-of-{num_parts:05d}.safetensors"


def export_hf_parts(out_dir: str | Path, spec: ModelSpec, dtype: str, write_parts, *, meta: dict | None = None,
                    tokenizer: bool = False) -> Path:
    """A Hugging Face directory whose safetensors files are written by ``write_parts(tmp_dir)`` (in a
    campaign: every trainer rank writes the tensors it owns, ``rl.weights.sender``), which returns one
    ``{hf name: file}`` per part; several files get ``model.safetensors.index.json``. Every tensor of
    the layout must be in exactly one part. Atomic: a temp dir renamed into place."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)

    def fill(tmp: Path) -> None:
        config = layout.config_dict(spec, dtype, bos_token_id=None, eos_token_id=IM_END_ID)
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
                                                                "pad_token_id": ENDOFTEXT_ID}))
        weight_map: dict[str, str] = {}
        for part in write_parts(tmp):
            twice = sorted(set(part) & set(weight_map))
            if twice:
                raise CheckpointError(f"export: {len(twice)} tensor(s) written by two parts (first: {twice[:3]})")
            weight_map.update(part)
        missing = sorted(set(layout.hf_shapes(spec)) - set(weight_map))
        if missing:
            raise CheckpointError(f"export: {len(missing)} tensor(s) of the layout written by no part (first: "
                                  f"{missing[:3]})", missing=missing[:10])
        if set(weight_map.values()) != {WEIGHTS_FILE}:
            size = sum((tmp / f).stat().st_size for f in set(weight_map.values()))
            (tmp / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
        if tokenizer:
            from rl.hf.tokenizer import write_tokenizer

            write_tokenizer(tmp)
        (tmp / META_FILE).write_text(json.dumps({"format": "t1ops.hf_export.v1", **(meta or {})}, indent=2))

    publish_dir(out_dir, fill, replace_empty=True)  # every file fsynced, then renamed into place
    return out_dir


_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16"}


def write_safetensors(path: Path, shapes: Mapping[str, tuple[int, ...]], dtype: torch.dtype, tensors) -> None:
    """One safetensors file written as ``tensors`` (an iterator of (name, tensor)) yields them: the header
    is laid out up front from ``shapes`` (every name, in the order they will come), then each tensor's
    bytes are appended and dropped. A tensor that comes out of order or with another shape is an error."""
    size = torch.empty((), dtype=dtype).element_size()
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        n = size * math.prod(shape)
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    order = iter(shapes.items())
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, t in tensors:
            want, shape = next(order, (None, None))
            if name != want or tuple(t.shape) != tuple(shape):
                raise CheckpointError(f"export: {name} {tuple(t.shape)} came where {want} {shape} was laid out; "
                                      "the state does not match this ModelSpec's layout", tensor=name)
            f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))


def read_meta(path: str | Path) -> dict:
    """``t1ops.json`` of an export ({} for a third-party checkpoint that has none)."""
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file():
        return {}
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"cannot read {meta_path}: {exc}", path=str(meta_path)) from exc
    if not isinstance(meta, dict):
        raise CheckpointError(f"{meta_path} is not a JSON object", path=str(meta_path))
    return meta


def export_vocab(path: str | Path):
    """The compact vocabulary (:class:`rl.vocab.CompactVocab`) a t1ops export carries in ``t1ops.json``,
    or None for a full-vocabulary checkpoint (any third-party one)."""
    meta = read_meta(path)
    if meta.get("vocab") != "compact":
        return None
    try:
        return CompactVocab.from_dict(meta["compact_vocab"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{Path(path) / META_FILE} says vocab 'compact' but its compact_vocab is unreadable: "
                              f"{exc!r}", path=str(path)) from exc


def check_actor_export(path: str | Path) -> dict:
    """Refuse an export whose ``t1ops.json`` names another role than ``actor``; return the meta."""
    meta = read_meta(path)
    role = meta.get("role", "actor")
    if role != "actor":
        raise CheckpointRoleError(f"{path} holds role {role!r}, not 'actor'; an engine serves only the actor's "
                                  "weights", path=str(path), found_role=role)
    return meta


def import_hf(path: str | Path, spec: ModelSpec | None = None) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """Read an export back: its ModelSpec (from ``config.json``) and the megatron state.

    ``spec`` (optional) must equal the directory's. Tensors keep the file's dtype.
    """
    checkpoint = HFCheckpoint(path, check_tokenizer=False)  # per weight sync: no 248k-entry JSON parse
    if spec is not None and spec != checkpoint.spec:
        raise CheckpointError(f"{path} holds a model of {checkpoint.spec}, expected {spec}", path=str(path))
    return checkpoint.spec, checkpoint.mcore_state(dtype=None)
