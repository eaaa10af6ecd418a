"""Read an offline W&B run back: the records of ``run-<id>.wandb``, parsed with the library's own
protobuf schema (``wandb.proto.wandb_internal_pb2.Record``), as ``wandb sync`` would upload them.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version) and then
LevelDB's log format: 32 KiB blocks of records ``crc32 (4, over type + data), length (2), type
(1: full, 2: first, 3: middle, 4: last), data``. The wandb package no longer ships a Python reader
(its service, wandb-core, reads these files), so this is the ~40 lines that check a run offline.
"""
from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Iterator

from t1ops.errors import InputError

_BLOCK = 32768
_HEADER = struct.Struct("<4sHB")
_RECORD = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str | Path) -> Iterator:
    """Every ``Record`` of one ``.wandb`` file, in order; InputError on a bad header or checksum."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = Path(path).read_bytes()
    ident, magic, _version = _HEADER.unpack_from(data, 0)
    if ident != b":W&B" or magic != 0xBEE1:
        raise InputError(f"{path} is not a W&B transaction log (header {ident!r}, magic {magic:#x})", path=str(path))
    pos, pending = _HEADER.size, b""
    while pos + _RECORD.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _RECORD.size:  # a block's zero trailer
            pos += left
            continue
        crc, length, kind = _RECORD.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zero padding at the end of a block or of the file
            pos += left
            continue
        chunk = data[pos + _RECORD.size: pos + _RECORD.size + length]
        if zlib.crc32(bytes([kind]) + chunk) != crc:
            raise InputError(f"{path}: record at byte {pos} fails its checksum (file truncated or corrupt)",
                             path=str(path))
        pos += _RECORD.size + length
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            record = Record()
            record.ParseFromString(pending)
            yield record


def run_history(path: str | Path) -> tuple[str, list[dict]]:
    """(run id, history rows) of one ``.wandb`` file; each row maps keys to decoded JSON values and
    holds ``_step``."""
    run_id, rows = "", []
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return run_id, rows
