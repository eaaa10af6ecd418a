"""Reading untrusted files and text with bounds (issue #28, docs/sandbox.md "Bounded input").

Everything an agent or a task author can write is read through here by the privileged
side: a file is opened ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file by
``fstat`` of the open descriptor (a FIFO swapped in for it can never block the open, a
link is never followed, and the type checked is the type read), and at most ``max_bytes``
are read. Parsers get bounded text: :func:`check_nesting` refuses deep JSON/TOML nesting
before a recursive parser sees it (an integer literal past Python's digit limit is a
``ValueError`` every caller catches, and every number is range-checked after parsing),
:func:`short` keeps every refusal message one bounded line.
"""
from __future__ import annotations

import os
import stat

MAX_NESTING = 64          # a task.toml or a CTRF report is a handful of levels deep
MAX_MESSAGE_CHARS = 300


class BoundedReadError(OSError):
    """The path is not a regular file, or cannot be opened without following a link."""


def read_regular(path: str | os.PathLike, max_bytes: int, *,
                 dir_fd: int | None = None) -> tuple[bytes, os.stat_result]:
    """(at most ``max_bytes`` of ``path``, its stat): never blocks, never follows a final
    link, refuses anything but a regular file; a longer file is a BoundedReadError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        raise BoundedReadError(f"{short(os.fspath(path), 120)}: cannot open without following a "
                               f"link ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BoundedReadError(f"{short(os.fspath(path), 120)}: not a regular file")
        if st.st_size > max_bytes:
            raise BoundedReadError(f"{short(os.fspath(path), 120)}: {st.st_size} bytes > {max_bytes}")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise BoundedReadError(f"{short(os.fspath(path), 120)}: more than {max_bytes} bytes")
        return data, st
    finally:
        os.close(fd)


def short(text: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters (the rest counted, not printed)."""
    s = str(text).replace("\n", "\\n").replace("\r", "\\r")
    return s if len(s) <= limit else f"{s[:limit]}...[{len(s) - limit} more chars]"


def check_nesting(text: str, limit: int = MAX_NESTING) -> str | None:
    """Why ``text`` (JSON or TOML) nests deeper than ``limit`` brackets, or None. Brackets
    inside strings count too: a conservative bound, never a false pass."""
    depth = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > limit:
                return f"nests deeper than {limit} levels"
        elif ch in "]}":
            depth -= 1
    return None
