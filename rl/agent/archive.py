"""Safe extraction of task archives (gzip tar or zip of one task directory): untrusted input.

The walkthrough's dataset rows are ``{path, task_binary}`` where ``task_binary``
is a gzip tar of the task directory. Every member is checked before anything is
written: absolute paths, ``..``, links that leave the root, device/fifo
members, and size or member-count bombs are refused with an
:class:`UnsafeArchiveError` naming the member. Extraction goes into a private
staging dir inside the destination and is renamed into place only when the
whole archive passed, so a refused archive leaves nothing behind.
"""
from __future__ import annotations

import bz2
import io
import lzma
import posixpath
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

from rl.agent.archive_rules import (MAX_COMPRESSED_BYTES, MAX_HEADER_BYTES, MAX_MEMBER_BYTES, MAX_MEMBERS,
                                   MAX_NAME_BYTES, MAX_TOTAL_BYTES, ArchiveLimits, free_target, normalised,
                                   task_name_of)
from rl.agent.bounded import short
from rl.agent.ziparchive import extract_zip
from rl.errors import UnsafeArchiveError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "hostile-archive": (),
}

__all__ = ["ArchiveLimits", "MAX_COMPRESSED_BYTES", "MAX_HEADER_BYTES", "MAX_MEMBER_BYTES", "MAX_MEMBERS",
           "MAX_NAME_BYTES", "MAX_TOTAL_BYTES", "check_headers", "check_members", "decompress", "extract_task_archive",
           "extract_task_bytes", "is_zip", "pack_task"]

_BLOCK = 512


def _link_stays_inside(member: tarfile.TarInfo, rel: PurePosixPath, top: str = "") -> bool:
    """Whether a link lands inside the *task* root: ``top`` (the single top folder that is
    stripped, or "" for the archive root), never merely inside the archive."""
    target = member.linkname
    if not target or target.startswith("/") or len(target) > MAX_NAME_BYTES:
        return False
    # symlinks resolve against the member's own dir; hard links against the archive root
    base = rel.parent if member.issym() else PurePosixPath(".")
    joined = posixpath.normpath(posixpath.join(str(base), target))
    if joined == ".." or joined.startswith("../") or joined.startswith("/"):
        return False
    return not top or joined == top or joined.startswith(top + "/")


def check_members(tar: tarfile.TarFile, archive: str, limits: ArchiveLimits) -> list[tarfile.TarInfo]:
    """Validate every member's header; returns the members in order or raises on the first bad one."""
    members: list[tarfile.TarInfo] = []
    files_before: set[str] = set()  # a hard link may only name a regular file archived before it
    total = 0
    for member in tar:
        if len(members) >= limits.max_members:
            raise UnsafeArchiveError(f"{archive}: more than {limits.max_members} members (at "
                                     f"{member.name!r}); refusing a member-count bomb",
                                     archive=archive, member=member.name)
        rel = normalised(member.name, archive)
        if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} is a device or fifo",
                                     archive=archive, member=member.name)
        if (member.issym() or member.islnk()) and not _link_stays_inside(member, rel):
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} links to {short(member.linkname, 120)!r} "
                                     "outside the task root", archive=archive, member=member.name)
        if member.islnk() and posixpath.normpath(member.linkname) not in files_before:
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} is a hard link to {member.linkname!r}, "
                                     "which is not a regular file earlier in the archive",
                                     archive=archive, member=member.name)
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} has unsupported type "
                                     f"{member.type!r}", archive=archive, member=member.name)
        if member.size > limits.max_member_bytes:
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} is {member.size} bytes "
                                     f"> {limits.max_member_bytes}", archive=archive, member=member.name)
        total += member.size
        if total > limits.max_total_bytes:
            raise UnsafeArchiveError(f"{archive}: members add up to more than {limits.max_total_bytes} "
                                     f"bytes (at {member.name!r}); refusing a size bomb",
                                     archive=archive, member=member.name)
        members.append(member)
        if member.isfile():
            files_before.add(posixpath.normpath(member.name))
    return members


def decompress(data: bytes, archive: str, limit: int) -> bytes:
    """The raw tar stream of ``data`` (gzip, bzip2, xz or none), never more than ``limit``
    bytes: a decompression bomb is refused after ``limit`` bytes, not after all of them."""
    if data[:2] == b"\x1f\x8b":
        d, kind = zlib.decompressobj(16 + zlib.MAX_WBITS), "gzip"
    elif data[:3] == b"BZh":
        d, kind = bz2.BZ2Decompressor(), "bzip2"
    elif data[:6] == b"\xfd7zXZ\x00":
        d, kind = lzma.LZMADecompressor(), "xz"
    else:
        return data
    try:
        if kind == "gzip":
            out = d.decompress(data, limit + 1)
        else:
            out = d.decompress(data, max_length=limit + 1)
    except (zlib.error, OSError, EOFError, ValueError, lzma.LZMAError) as e:
        raise UnsafeArchiveError(f"{archive}: corrupt {kind} stream ({short(e, 120)})", archive=archive,
                                 member=None) from None
    if len(out) > limit:
        raise UnsafeArchiveError(f"{archive}: decompresses to more than {limit} bytes; refusing a "
                                 "decompression bomb", archive=archive, member=None)
    return out


def check_headers(raw: bytes, archive: str, limits: "ArchiveLimits") -> None:
    """Walk the tar headers of ``raw`` before tarfile parses any: a GNU long-name/long-link
    (``L``/``K``) or pax (``x``/``g``) header larger than :data:`MAX_HEADER_BYTES`, a member
    size that runs past the stream, or more headers than members allowed, is refused here."""
    pos, count = 0, 0
    while pos + _BLOCK <= len(raw):
        block = raw[pos:pos + _BLOCK]
        if block == b"\0" * _BLOCK:
            return
        count += 1
        if count > 2 * limits.max_members + 2:
            raise UnsafeArchiveError(f"{archive}: more than {limits.max_members} members; refusing a "
                                     "member-count bomb", archive=archive, member=None)
        size = _header_size(block[124:136], archive)
        kind = block[156:157]
        if kind in (b"L", b"K", b"x", b"g") and size > MAX_HEADER_BYTES:
            what = {b"L": "GNU long-name", b"K": "GNU long-link", b"x": "pax", b"g": "pax global"}[kind]
            raise UnsafeArchiveError(f"{archive}: a {what} header of {size} bytes (at most "
                                     f"{MAX_HEADER_BYTES}); refusing it unread", archive=archive,
                                     member=None)
        pos += _BLOCK + -(-size // _BLOCK) * _BLOCK
    # a truncated stream is tarfile's to report


def _header_size(field: bytes, archive: str) -> int:
    if field[:1] and field[0] & 0x80:   # base-256 (GNU) encoding
        return int.from_bytes(field[1:], "big") if not field[0] & 0x40 else -1
    text = field.split(b"\0", 1)[0].strip(b" \0")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise UnsafeArchiveError(f"{archive}: a tar header has a malformed size field",
                                 archive=archive, member=None) from None


def _open(data: bytes, archive: str, limits: "ArchiveLimits | None" = None) -> tarfile.TarFile:
    limits = limits or ArchiveLimits()
    # the members' bytes plus, per member, its header, padding and a long name at most
    raw = decompress(data, archive, limits.max_total_bytes + limits.max_members * (3 * _BLOCK + MAX_NAME_BYTES)
                     + 4 * MAX_HEADER_BYTES)
    check_headers(raw, archive, limits)
    try:
        return tarfile.open(fileobj=io.BytesIO(raw), mode="r:")
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        raise UnsafeArchiveError(f"{archive}: not a readable tar or zip archive ({short(e, 120)})",
                                 archive=archive, member=None) from None


def is_zip(data: bytes) -> bool:
    return data[:4] in (b"PK\x03\x04", b"PK\x05\x06")


def extract_task_bytes(data: bytes, dest: str | Path, *, name: str | None = None,
                       archive: str = "<bytes>", limits: ArchiveLimits = ArchiveLimits()) -> Path:
    """Extract one task archive (gzip tar, or zip: :mod:`rl.agent.ziparchive`) into
    ``dest/<name>`` and return that path.

    ``name`` defaults to the archive's single top-level directory. The target must
    not exist yet. Nothing is written outside ``dest``; on refusal nothing stays.
    """
    if len(data) > limits.max_compressed_bytes:
        raise UnsafeArchiveError(f"{archive}: {len(data)} compressed bytes > "
                                 f"{limits.max_compressed_bytes}", archive=archive, member=None)
    dest_dir = Path(dest).resolve()
    dest_dir.mkdir(parents=True, exist_ok=True)
    if is_zip(data):
        return extract_zip(data, dest_dir, name=name, archive=archive, limits=limits)
    try:
        with _open(data, archive, limits) as tar:
            members = check_members(tar, archive, limits)
            parts = [normalised(m.name, archive).parts for m in members]
            task_name, strip = task_name_of(parts, name, archive)
            top = next(ps[0] for ps in parts if ps) if strip else ""
            for m, ps in zip(members, parts):   # links are judged against the task root
                if (m.issym() or m.islnk()) and not _link_stays_inside(m, PurePosixPath(*ps), top):
                    raise UnsafeArchiveError(f"{archive}: member {short(m.name, 120)!r} links to "
                                             f"{short(m.linkname, 120)!r} outside the task root",
                                             archive=archive, member=short(m.name, 120))
            target = free_target(dest_dir, task_name, archive)
            with tempfile.TemporaryDirectory(prefix=".import-", dir=dest_dir) as staging:
                tar.extractall(staging, members=members, filter="data")
                shutil.move(str(Path(staging) / top), str(target))
    except UnsafeArchiveError:
        raise
    except tarfile.TarError as e:   # the stdlib "data" filter is a second line of defence
        raise UnsafeArchiveError(f"{archive}: refused by the tar data filter ({short(e, 200)})",
                                 archive=archive, member=short(getattr(getattr(e, "tarinfo", None),
                                                                       "name", ""), 120)) from None
    except (EOFError, OSError, ValueError, UnicodeDecodeError) as e:
        raise UnsafeArchiveError(f"{archive}: corrupt archive ({type(e).__name__}: {short(e, 200)})",
                                 archive=archive, member=None) from None
    return target


def extract_task_archive(path: str | Path, dest: str | Path, *, name: str | None = None,
                         limits: ArchiveLimits = ArchiveLimits()) -> Path:
    """:func:`extract_task_bytes` for a ``.tar.gz`` / ``.zip`` file on disk."""
    p = Path(path)
    size = p.stat().st_size
    if size > limits.max_compressed_bytes:
        raise UnsafeArchiveError(f"{p}: {size} bytes > {limits.max_compressed_bytes}", archive=str(p),
                                 member=None)
    return extract_task_bytes(p.read_bytes(), dest, name=name, archive=str(p), limits=limits)


def pack_task(task_dir: str | Path) -> bytes:
    """A gzip tar of ``task_dir`` with the directory as its single top-level entry."""
    src = Path(task_dir)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(src, arcname=src.name)
    return buf.getvalue()
