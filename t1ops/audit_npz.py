"""The shape of every ``.npz`` member, checked against the file before any array is allocated.

A dump is outside data (issue #51): a 1.5 KB ``.npz`` can declare an 8 TiB array in its
``.npy`` header, and numpy allocates what the header says before it reads a byte; a real
zero-filled one deflates 1000:1 and would take the host's memory while it is read. So each
member's header is read alone (``numpy.lib.format``, no data), and the member is refused unless

- its dtype holds no Python objects (nothing is unpickled, ever);
- the bytes its shape needs equal the bytes the zip member holds after the header;
- that size is one the compressed member can hold (deflate expands at most ~1032:1; a stored
  member holds exactly its size), and the whole dump stays under :data:`MAX_DUMP_BYTES`.

Every refusal is a ParseError naming the file and the member, never a traceback.
"""
from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from rl.errors import ParseError

MAX_DUMP_BYTES = 2 * 2**30   # one chunk of a trajectory is a few MiB; this is far above any real one
MAX_DEFLATE_RATIO = 1032     # deflate's largest expansion (RFC 1951: 258 bytes from a 2-bit code)


def _header(f) -> tuple[tuple[int, ...], np.dtype, int]:
    version = np.lib.format.read_magic(f)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:
        raise ValueError(f".npy format version {version} is not one numpy's savez writes")
    shape, _, dtype = read(f, max_header_size=10_000)
    return shape, dtype, f.tell()


def check_members(path: Path, z: zipfile.ZipFile) -> None:
    """Refuse (ParseError) any member whose declared array the file cannot hold (module doc)."""
    total = 0
    for info in z.infolist():
        name = info.filename
        if not name.endswith(".npy"):
            continue
        key = name[:-4]
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise ParseError(f"{path}: member {key!r} says {info.file_size} bytes but stores {info.compress_size}",
                             path=str(path), key=key)
        if info.file_size > max(info.compress_size, 1) * MAX_DEFLATE_RATIO:
            raise ParseError(f"{path}: member {key!r} claims {info.file_size} bytes from {info.compress_size} "
                             "compressed; no deflate stream expands that far", path=str(path), key=key)
        try:
            with z.open(info) as f:
                shape, dtype, header_len = _header(f)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, SyntaxError, TypeError) as exc:
            raise ParseError(f"{path}: member {key!r} has no readable .npy header ({str(exc)[:120]})",
                             path=str(path), key=key) from None
        if dtype.hasobject:
            raise ParseError(f"{path}: member {key!r} holds Python objects (dtype {dtype}); pickles are never "
                             "loaded", path=str(path), key=key)
        need = math.prod(shape) * dtype.itemsize
        if need != info.file_size - header_len:
            raise ParseError(f"{path}: member {key!r} declares shape {shape[:4]} of {dtype} ({need} bytes) but "
                             f"holds {info.file_size - header_len}; the file is truncated or forged",
                             path=str(path), key=key)
        total += need
        if total > MAX_DUMP_BYTES:
            raise ParseError(f"{path}: its arrays hold over {MAX_DUMP_BYTES} bytes; a trajectory chunk is a "
                             "few MiB", path=str(path), key=key)
