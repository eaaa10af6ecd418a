"""Read a Hugging Face checkpoint directory a team brings (``[model] path``), one unit at a time.

:class:`HFCheckpoint` opens ``config.json`` (the architecture and shape, :func:`rl.hf.layout.spec_from_config`)
and the safetensors files (one file, or shards listed by ``model.safetensors.index.json``), and checks
the whole directory before anything is built: every shard present and complete, every tensor of the
architecture present once with its shape and a floating dtype, nothing unknown, the tokenizer's ids
inside ``vocab_size``. Each error is one line naming the file and the tensor; nothing half-loaded starts.

Reading is lazy: :meth:`HFCheckpoint.mcore_state` converts only the megatron tensors asked for, reading
only their units' HF tensors, so a trainer rank asks for its shard's names (its local experts, not the
others') and each non-expert tensor is read whole one unit at a time and cut to the rank's slice by
:mod:`rl.trainer.shard`. Names of ``Qwen3_5MoeForConditionalGeneration`` checkpoints
(``model.language_model.*``) are read as the text model's; the vision tower (``model.visual.*``) and
multi-token-prediction layers (``mtp.*``) are set aside, listed in :attr:`HFCheckpoint.set_aside`.

A compact vocabulary (:mod:`rl.vocab`, the embedded tiny model's option) takes the checkpoint's rows
of the ids it keeps; its UNK row (input only, never sampled) is the mean of the kept rows.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

import torch

from rl.errors import CheckpointError
from rl.hf import layout
from rl.model import ModelSpec

INDEX_FILE = "model.safetensors.index.json"
_SET_ASIDE = ("model.visual.", "mtp.", "model.mtp.")
_FLOAT_DTYPES = ("F32", "BF16", "F16")
_VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")


def read_config(path: str | Path) -> dict:
    config_path = Path(path) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"cannot read {config_path}: {exc}; pass a Hugging Face checkpoint directory",
                              path=str(path)) from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} is not a JSON object", path=str(path))
    return config


def _canonical(name: str) -> str:
    """The text model's name of a tensor (multimodal wrappers nest it under ``model.language_model``)."""
    return "model." + name[len("model.language_model."):] if name.startswith("model.language_model.") else name


class HFCheckpoint:
    """A checked Hugging Face checkpoint directory; :attr:`spec` is its model."""

    def __init__(self, path: str | Path, *, check_tokenizer: bool = True) -> None:
        """``check_tokenizer`` False: skip parsing ``tokenizer.json`` (a t1ops export read back on every
        disk weight sync carries the tokenizer t1ops wrote; a checkpoint a team brings is checked)."""
        self.path = Path(path)
        if not self.path.is_dir():
            raise CheckpointError(f"model.path {self.path} is not a directory; give a Hugging Face checkpoint "
                                  "directory (config.json + *.safetensors)", path=str(self.path))
        self.config = read_config(self.path)
        self.spec: ModelSpec = layout.spec_from_config(self.config, where=str(self.path / "config.json"))
        self._where: dict[str, tuple[Path, str]] = {}  # canonical name -> (file, name in the file)
        self._handles: dict[Path, object] = {}
        self.set_aside: list[str] = []
        self.units = {u.mcore: u for u in layout.units(self.spec)}  # megatron name -> its conversion unit
        self._index()
        self._check_tensors()
        if check_tokenizer:
            self.check_tokenizer()

    # --- the files -------------------------------------------------------------------
    def _files(self) -> list[Path]:
        index = self.path / INDEX_FILE
        if not index.is_file():
            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"no *.safetensors in {self.path}", path=str(self.path))
            return files
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CheckpointError(f"cannot read {index}: {exc!r} (a JSON object with a weight_map)", path=str(index)) from exc
        files = sorted({self.path / f for f in weight_map.values()})
        for f in files:
            if not f.is_file():
                tensor = next(n for n, v in weight_map.items() if self.path / v == f)
                raise CheckpointError(f"{f} is missing: {INDEX_FILE} puts {tensor} (and others) there", path=str(f))
        return files

    def _open(self, f: Path):
        from safetensors import SafetensorError, safe_open

        if f not in self._handles:
            try:
                self._handles[f] = safe_open(str(f), "pt")
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(f"cannot read {f}: {exc} (truncated, or not safetensors)", path=str(f)) from exc
        return self._handles[f]

    def _index(self) -> None:
        for f in self._files():
            handle = self._open(f)
            for name in handle.keys():
                if name.startswith(_SET_ASIDE) or name.startswith("model.language_model.visual."):
                    self.set_aside.append(name)
                    continue
                canonical = _canonical(name)
                if canonical in self._where:
                    raise CheckpointError(f"{f}: tensor {name} is also in {self._where[canonical][0]}", path=str(f))
                self._where[canonical] = (f, name)

    def _check_tensors(self) -> None:
        expected = layout.hf_shapes(self.spec)
        missing = sorted(set(expected) - set(self._where))
        if missing:
            raise CheckpointError(f"{self.path}: {len(missing)} tensor(s) of the {self.spec.arch} layout are missing "
                                  f"(first: {missing[0]}); a shard is incomplete or the config does not match",
                                  path=str(self.path), missing=missing[:10])
        unknown = sorted(set(self._where) - set(expected))
        if unknown:
            f, name = self._where[unknown[0]]
            raise CheckpointError(f"{f}: tensor {name} is not part of the {self.spec.arch} layout of config.json "
                                  f"({len(unknown)} such)", path=str(f), unknown=unknown[:10])
        for canonical, shape in expected.items():
            f, name = self._where[canonical]
            piece = self._open(f).get_slice(name)
            if tuple(piece.get_shape()) != shape:
                raise CheckpointError(f"{f}: tensor {name} has shape {tuple(piece.get_shape())}, config.json implies "
                                      f"{shape}", path=str(f), tensor=name)
            if piece.get_dtype() not in _FLOAT_DTYPES:
                raise CheckpointError(f"{f}: tensor {name} has dtype {piece.get_dtype()}, expected one of "
                                      f"{list(_FLOAT_DTYPES)}", path=str(f), tensor=name)

    def check_tokenizer(self) -> None:
        """A ``tokenizer.json`` whose ids reach ``vocab_size`` or beyond cannot go with these weights."""
        tok = self.path / "tokenizer.json"
        if not tok.is_file():
            return
        try:
            data = json.loads(tok.read_text())
            ids = [int(i) for i in (data.get("model") or {}).get("vocab", {}).values()]
            ids += [int(t["id"]) for t in data.get("added_tokens") or []]
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise CheckpointError(f"cannot read {tok}: {exc!r}", path=str(tok)) from exc
        if ids and max(ids) >= self.spec.vocab_size:
            raise CheckpointError(f"{tok} has token id {max(ids)} but config.json's vocab_size is "
                                  f"{self.spec.vocab_size}: tokenizer and weights do not belong together",
                                  path=str(tok), vocab_size=self.spec.vocab_size)

    # --- reading ---------------------------------------------------------------------
    def read(self, canonical: str) -> torch.Tensor:
        from safetensors import SafetensorError

        f, name = self._where[canonical]
        try:
            return self._open(f).get_tensor(name)
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read tensor {name} of {f}: {exc}", path=str(f), tensor=name) from exc

    def mcore_state(self, names: Iterable[str] | None = None, vocab=None,
                    dtype: torch.dtype | None = torch.float32) -> dict[str, torch.Tensor]:
        """megatron tensors (world-of-1 layout) by name: all, or only ``names``; ``vocab`` a CompactVocab;
        ``dtype`` None keeps the file's."""
        unknown = [] if names is None else [n for n in names if n not in self.units]
        if unknown:
            raise CheckpointError(f"{unknown[:3]} are not tensors of the {self.spec.arch} policy", path=str(self.path))
        out: dict[str, torch.Tensor] = {}
        for unit in (self.units.values() if names is None else [self.units[n] for n in names]):
            tensor = unit.merge(tuple(self.read(n) for n in unit.hf))
            tensor = tensor if dtype is None else tensor.to(dtype)
            if vocab is not None and unit.mcore in _VOCAB_ROWS:
                tensor = compact_rows(tensor, vocab)
            out[unit.mcore] = tensor
        return out


def compact_rows(rows_VH: torch.Tensor, vocab) -> torch.Tensor:
    """The rows of a compact vocabulary's ids (UNK: the mean of the kept rows)."""
    if vocab.size == rows_VH.shape[0] and vocab.unk_id is None:
        return rows_VH
    kept = torch.as_tensor(vocab.decode(range(vocab.num_known)), dtype=torch.long)
    out = rows_VH[kept]
    if vocab.unk_id is not None:
        out = torch.cat([out, out.mean(0, keepdim=True)])
    if out.shape[0] < vocab.size:  # padded to a multiple of tp: rows never indexed
        out = torch.cat([out, out.new_zeros(vocab.size - out.shape[0], out.shape[1])])
    return out.contiguous()


class CheckpointState(Mapping):
    """A role's full (world-of-1) megatron state read from an :class:`HFCheckpoint` on demand: a trainer
    rank that loads its shard (:func:`rl.trainer.shard.local_from_full`) reads only the units it holds.

    ``role = "critic"``: the checkpoint's trunk and a fresh value head (zeros: a fresh critic predicts
    0, rl.model.build), as the report warm-starts its critic from the policy's weights.
    """

    _HEAD = {"output_layer.weight", "output_layer.bias"}

    def __init__(self, checkpoint: HFCheckpoint, vocab=None, role: str = "actor") -> None:
        self.checkpoint, self.vocab, self.role = checkpoint, vocab, role
        names = list(checkpoint.units)
        self._names = names if role == "actor" else [n for n in names if n not in self._HEAD] + sorted(self._HEAD)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, name: str) -> torch.Tensor:
        if self.role == "critic" and name in self._HEAD:
            hidden = self.checkpoint.spec.hidden_size
            return torch.zeros(1, hidden) if name.endswith("weight") else torch.zeros(1)
        if name not in self._names:
            raise KeyError(name)
        return self.checkpoint.mcore_state([name], vocab=self.vocab)[name]
