"""A fixed, saved mapping between tokenizer ids and a tiny model's compact ids.

Why this exists: the real Qwen3.5 tokenizer has 248,320 ids. A tiny CPU model
with that many output logits spends almost all its memory and time on the LM
head at campaign batch sizes (B x T x 248,320 floats), so the embedded model
works over a compact vocabulary: the ids that actually occur in the corpus
(task texts, solutions, chat-template specials), plus one UNK compact id.

Contract:
- compact ids ``0 .. num_known-1`` are real tokenizer ids (sorted ascending);
  the UNK compact id, when present, is ``num_known`` (the last one).
- UNK is used ONLY for input ids outside the subset (``encode_inputs``). The
  model never samples it and log-probs are normalised over the real compact
  ids only (``rl.model`` masks the UNK logit), so every sampled token is a
  real tokenizer id and its log-prob is exact for the model's distribution.
- Targets / loss positions must map exactly (``encode_targets``): an id the
  model cannot sample raises DataContractError instead of becoming UNK.
- A production model uses the full vocabulary: ``CompactVocab.identity(n)``
  maps every id to itself and has no UNK.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from rl.atomic import publish_file
from rl.errors import DataContractError, InputError, ParseError

_FORMAT = "t1ops.compact_vocab.v1"


class CompactVocab:
    """Bidirectional full-id <-> compact-id mapping (see module docstring)."""

    def __init__(self, full_ids: Iterable[int], full_vocab_size: int, has_unk: bool = True) -> None:
        ids_K = np.unique(np.asarray(list(full_ids), dtype=np.int64))
        if ids_K.size == 0:
            raise InputError("full_ids is empty; a vocabulary needs at least one token id")
        if ids_K[0] < 0 or ids_K[-1] >= full_vocab_size:
            raise InputError(
                f"full_ids must lie in [0, {full_vocab_size}); got range [{ids_K[0]}, {ids_K[-1]}]",
                full_vocab_size=full_vocab_size,
            )
        self.full_vocab_size = int(full_vocab_size)
        self.has_unk = bool(has_unk)
        self._full_ids_K = ids_K
        self._is_identity = (not has_unk) and ids_K.size == full_vocab_size
        self._to_compact = None if self._is_identity else {int(f): c for c, f in enumerate(ids_K)}

    # --- construction ---------------------------------------------------------
    @classmethod
    def identity(cls, n: int) -> "CompactVocab":
        """Full vocabulary of ``n`` ids, each mapped to itself, without UNK."""
        return cls(range(n), n, has_unk=False)

    @classmethod
    def from_texts(
        cls,
        texts: Iterable[str],
        encode: Callable[[str], list[int]],
        full_vocab_size: int,
        extra_ids: Iterable[int] = (),
    ) -> "CompactVocab":
        """Vocabulary of every id ``encode`` yields on ``texts`` plus ``extra_ids``.

        ``extra_ids`` carries ids no text produces on its own (chat-template
        specials such as ``<|im_start|>`` = 248045, ``<|im_end|>``, EOS).
        """
        ids: set[int] = set(int(i) for i in extra_ids)
        for text in texts:
            ids.update(int(i) for i in encode(text))
        return cls(ids, full_vocab_size, has_unk=True)

    # --- sizes ----------------------------------------------------------------
    @property
    def num_known(self) -> int:
        """Real tokenizer ids in the vocabulary (sampleable compact ids)."""
        return int(self._full_ids_K.size)

    @property
    def size(self) -> int:
        """Compact vocabulary size: the model's ``vocab_size``."""
        return self.num_known + (1 if self.has_unk else 0)

    @property
    def unk_id(self) -> int | None:
        """Compact id of UNK (inputs only), or None for a vocabulary without one."""
        return self.num_known if self.has_unk else None

    # --- mapping --------------------------------------------------------------
    def encode_inputs(self, full_ids: Iterable[int]) -> list[int]:
        """Full ids -> compact ids for model INPUTS; unknown ids become UNK."""
        ids = [int(i) for i in full_ids]
        if self._is_identity:
            self._check_range(ids, "full_ids")
            return ids
        if not self.has_unk:
            return self.encode_targets(ids)
        return [self._to_compact.get(i, self.num_known) for i in ids]

    def encode_targets(self, full_ids: Iterable[int]) -> list[int]:
        """Full ids -> compact ids for TARGETS; an unknown id raises.

        A target the model cannot sample has no exact log-prob, so it is a
        data-contract violation, never silently UNK.
        """
        ids = [int(i) for i in full_ids]
        if self._is_identity:
            self._check_range(ids, "full_ids")
            return ids
        missing = [i for i in ids if i not in self._to_compact]
        if missing:
            raise DataContractError(
                f"{len(missing)} target id(s) are outside the compact vocabulary "
                f"(first: {missing[:5]}); rebuild the vocabulary from a corpus that contains them",
                missing_ids=missing[:20],
            )
        return [self._to_compact[i] for i in ids]

    def decode(self, compact_ids: Iterable[int]) -> list[int]:
        """Compact ids -> full tokenizer ids; UNK or out-of-range raises."""
        ids = np.asarray(list(compact_ids), dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_known):
            raise DataContractError(
                f"compact ids must lie in [0, {self.num_known}) to decode (UNK never decodes); "
                f"got range [{ids.min()}, {ids.max()}]",
                num_known=self.num_known,
            )
        return [int(i) for i in self._full_ids_K[ids]]

    def _check_range(self, ids: list[int], name: str) -> None:
        if ids and (min(ids) < 0 or max(ids) >= self.full_vocab_size):
            raise DataContractError(
                f"{name} must lie in [0, {self.full_vocab_size}); got [{min(ids)}, {max(ids)}]",
                full_vocab_size=self.full_vocab_size,
            )

    # --- persistence ----------------------------------------------------------
    def to_dict(self) -> dict:
        full_ids = [] if self._is_identity else [int(i) for i in self._full_ids_K]
        return {
            "format": _FORMAT,
            "full_vocab_size": self.full_vocab_size,
            "has_unk": self.has_unk,
            "identity": self._is_identity,
            "full_ids": full_ids,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "CompactVocab":
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ParseError(f"not a compact vocabulary (expected format {_FORMAT!r})")
        if data["identity"]:
            return cls.identity(int(data["full_vocab_size"]))
        return cls(data["full_ids"], int(data["full_vocab_size"]), has_unk=bool(data["has_unk"]))

    def save(self, path: str | Path) -> None:
        """Write JSON atomically and durably (``rl.atomic.publish_file``)."""
        publish_file(path, json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "CompactVocab":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ParseError(f"cannot read compact vocabulary {path}: {exc}", path=str(path)) from exc
        return cls.from_dict(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompactVocab) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"CompactVocab(num_known={self.num_known}, has_unk={self.has_unk}, full={self.full_vocab_size})"
