"""Atomic, durable publication of a file or a directory: the one temp-then-rename helper.

Readers never see half a file: the content is written to a temp name in the same directory,
flushed and fsynced, renamed over the final name, and the directory is fsynced so the rename
itself survives a power loss (a rename without the directory fsync can vanish on ext4/xfs after a
crash, leaving the old file or none). Directories (checkpoints, trainer state, exports) are built
in a temp directory, every file in it fsynced, then the directory renamed into place.

``durable=False`` keeps the atomicity and skips the fsyncs, for liveness signals whose loss in a
power cut is irrelevant (a rank's progress beacon, rewritten every micro-batch).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, IO


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: str | Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write ``path`` (binary) with ``write(f)``, then flush and fsync it."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _as_writer(data: bytes | str | Callable[[IO[bytes]], object]) -> Callable[[IO[bytes]], object]:
    if callable(data):
        return data
    raw = data.encode() if isinstance(data, str) else data
    return lambda f: f.write(raw)


def publish_file(path: str | Path, data: bytes | str | Callable[[IO[bytes]], object], *,
                 durable: bool = True) -> Path:
    """Atomically replace ``path`` with ``data`` (bytes, text, or ``write(f)`` on a binary file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            _as_writer(data)(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # never leave a half-written temp file beside the real one
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def publish_dir(final: str | Path, fill: Callable[[Path], object], *, replace_empty: bool = False) -> Path:
    """Build ``final`` atomically: ``fill(tmp_dir)`` writes the files, each is fsynced, then the
    directory is renamed into place and its parent fsynced. ``final`` must not exist (or, with
    ``replace_empty``, be an empty directory); a failure leaves no trace."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        fill(tmp)
        for root, _, files in os.walk(tmp):
            for name in files:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fsync_dir(root)
        if replace_empty and final.is_dir() and not any(final.iterdir()):
            final.rmdir()
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(final.parent)
    return final
