"""Reading untrusted files and text with bounds (issue #28, docs/sandbox.md "Bounded input").

Everything an agent or a task author can write is read through here by the privileged
side: a file is opened ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file by
``fstat`` of the open descriptor (a FIFO swapped in for it can never block the open, a
link is never followed, and the type checked is the type read), and at most ``max_bytes``
are read. Parsers get bounded text: :func:`check_nesting` refuses deep JSON/TOML nesting
before a recursive parser sees it (an integer literal past Python's digit limit is a
``ValueError`` every caller catches, and every number is range-checked after parsing),
:func:`short` keeps every refusal message one bounded, printable line (:func:`printable`
escapes control characters: issue #51).
"""
from __future__ import annotations

import os
import re
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


# C0 and C1 controls, DEL, and the Unicode controls that reorder or hide text on a terminal
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def printable(text: object) -> str:
    """``text`` with every control character escaped (``\\n``, ``\\x1b``, ``\\u202e``): what a
    trial printed can never move the operator's cursor, colour, retitle or rewrite a terminal
    line (issue #51). Tabs become ``\\t`` too: one line stays one line."""
    def esc(m: re.Match) -> str:
        c = m.group()
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (
            f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
    return _CONTROL.sub(esc, str(text))


def short(text: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as one printable line of at most ``limit`` characters (the rest counted, not printed)."""
    s = printable(text)
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
