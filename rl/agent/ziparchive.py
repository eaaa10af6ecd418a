"""Zip task archives, under the same safety rules as tar (rl/agent/archive_rules.py).

Every member is checked before anything is written: absolute paths, ``..``, links
that leave the task root, device/fifo/socket members, encrypted members, and size or
member-count bombs are refused with an :class:`UnsafeArchiveError` naming the member.
Sizes are enforced while decompressing too (a zip header can lie about them).
Extraction goes into a private staging dir and is renamed into place only when the
whole archive passed; permission bits keep at most ``rwxr-xr-x``.
"""
from __future__ import annotations

import io
import os
import posixpath
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from rl.agent.archive_rules import ArchiveLimits, free_target, normalised, task_name_of
from rl.errors import UnsafeArchiveError

_CHUNK = 1 << 16
MAX_LINK_BYTES = 4096


def _kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    if info.is_dir():
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    if mode and not stat.S_ISREG(mode) and stat.S_IFMT(mode):
        return "special"
    return "file"


def _check(zf: zipfile.ZipFile, archive: str, limits: ArchiveLimits) -> list[tuple[zipfile.ZipInfo, PurePosixPath, str]]:
    out, total = [], 0
    for info in zf.infolist():
        name = info.filename
        if len(out) >= limits.max_members:
            raise UnsafeArchiveError(f"{archive}: more than {limits.max_members} members (at {name!r}); "
                                     "refusing a member-count bomb", archive=archive, member=name)
        rel = normalised(name.rstrip("/") or name, archive)   # bounded name length too
        kind = _kind(info)
        if kind == "special":
            raise UnsafeArchiveError(f"{archive}: member {name!r} is a device, fifo or socket",
                                     archive=archive, member=name)
        if info.flag_bits & 0x1:
            raise UnsafeArchiveError(f"{archive}: member {name!r} is encrypted", archive=archive,
                                     member=name)
        if info.file_size > limits.max_member_bytes:
            raise UnsafeArchiveError(f"{archive}: member {name!r} is {info.file_size} bytes "
                                     f"> {limits.max_member_bytes}", archive=archive, member=name)
        total += info.file_size
        if total > limits.max_total_bytes:
            raise UnsafeArchiveError(f"{archive}: members add up to more than {limits.max_total_bytes} "
                                     f"bytes (at {name!r}); refusing a size bomb", archive=archive,
                                     member=name)
        if kind == "link":
            _check_link(zf, info, rel, archive)
        out.append((info, rel, kind))
    return out


def _check_link(zf: zipfile.ZipFile, info: zipfile.ZipInfo, rel: PurePosixPath, archive: str) -> None:
    if info.file_size > MAX_LINK_BYTES:
        raise UnsafeArchiveError(f"{archive}: link member {info.filename!r} is too long",
                                 archive=archive, member=info.filename)
    target = zf.read(info).decode("utf-8", errors="replace")
    joined = posixpath.normpath(posixpath.join(str(rel.parent), target))
    if not target or target.startswith("/") or joined == ".." or joined.startswith("../"):
        raise UnsafeArchiveError(f"{archive}: member {info.filename!r} links to {target!r} outside "
                                 "the task root", archive=archive, member=info.filename)


def _write(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, limits: ArchiveLimits,
           archive: str) -> None:
    written = 0
    with zf.open(info) as src, open(path, "xb") as dst:
        while chunk := src.read(_CHUNK):
            written += len(chunk)
            if written > min(info.file_size, limits.max_member_bytes):
                raise UnsafeArchiveError(f"{archive}: member {info.filename!r} inflates past its "
                                         "declared size; refusing a lying header", archive=archive,
                                         member=info.filename)
            dst.write(chunk)
    mode = (info.external_attr >> 16) & 0o755
    os.chmod(path, mode | 0o644 if mode else 0o644)


def _inside(path: Path, root: Path, member: str, archive: str) -> None:
    if not path.resolve().is_relative_to(root.resolve()):
        raise UnsafeArchiveError(f"{archive}: member {member!r} resolves outside the task root "
                                 "through a link", archive=archive, member=member)


def extract_zip(data: bytes, dest_dir: Path, *, name: str | None, archive: str,
                limits: ArchiveLimits) -> Path:
    """Extract a zip task archive into ``dest_dir/<name>`` (see module doc)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = _check(zf, archive, limits)
            parts = [rel.parts for _, rel, _ in members]
            task_name, strip = task_name_of(parts, name, archive)
            target = free_target(dest_dir, task_name, archive)
            with tempfile.TemporaryDirectory(prefix=".import-", dir=dest_dir) as staging:
                root = Path(staging) / "t"
                root.mkdir()
                for info, rel, kind in members:
                    rel_parts = rel.parts[1:] if strip else rel.parts
                    if not rel_parts:
                        continue
                    path = root.joinpath(*rel_parts)
                    if kind == "dir":
                        path.mkdir(parents=True, exist_ok=True)
                        continue
                    path.parent.mkdir(parents=True, exist_ok=True)
                    _inside(path.parent, root, info.filename, archive)
                    if kind == "link":
                        os.symlink(zf.read(info).decode("utf-8", errors="replace"), path)
                    else:
                        _write(zf, info, path, limits, archive)
                for p in root.rglob("*"):     # link chains: every link must land inside
                    if p.is_symlink():
                        _inside(p, root, str(p.relative_to(root)), archive)
                shutil.move(str(root), str(target))
    except UnsafeArchiveError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError,
            NotImplementedError, UnicodeDecodeError, RuntimeError) as e:
        raise UnsafeArchiveError(f"{archive}: corrupt or unsupported zip ({type(e).__name__}: {e})",
                                 archive=archive, member=None) from e
    return target
