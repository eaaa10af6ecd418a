"""The rules every task archive format shares (tar: ``rl.agent.archive``; zip: ``rl.agent.ziparchive``).

Bounds, member-name normalisation, the task name and the fresh target
directory: one definition below both extractors, so neither imports the other
back.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rl.agent.bounded import short
from rl.errors import InputError, UnsafeArchiveError

MAX_MEMBERS = 2_000
MAX_TOTAL_BYTES = 64 * 1024 * 1024     # a terminal task is KiBs; 64 MiB leaves room for data files
MAX_MEMBER_BYTES = 32 * 1024 * 1024
MAX_COMPRESSED_BYTES = 32 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024          # a GNU long-name/long-link or pax header: a path, not data
MAX_NAME_BYTES = 1024                 # a member path (each component at most 255)

@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds on one archive (checked on the header values, before extraction)."""

    max_members: int = MAX_MEMBERS
    max_total_bytes: int = MAX_TOTAL_BYTES
    max_member_bytes: int = MAX_MEMBER_BYTES
    max_compressed_bytes: int = MAX_COMPRESSED_BYTES

    def __post_init__(self) -> None:
        for name in ("max_members", "max_total_bytes", "max_member_bytes", "max_compressed_bytes"):
            if getattr(self, name) <= 0:
                raise InputError(f"ArchiveLimits.{name} = {getattr(self, name)} must be > 0",
                                 argument=name)


def normalised(name: str, archive: str) -> PurePosixPath:
    """A member name as a relative path inside the root, or UnsafeArchiveError."""
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES or any(
            len(p.encode("utf-8", "surrogateescape")) > 255 for p in name.split("/")):
        raise UnsafeArchiveError(f"{archive}: member {short(name, 80)!r} has a name over {MAX_NAME_BYTES} "
                                 "bytes (or a component over 255)", archive=archive, member=short(name, 80))
    if not name or "\x00" in name:
        raise UnsafeArchiveError(f"{archive}: member {name!r} has an empty or NUL-bearing name",
                                 archive=archive, member=name)
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(f"{archive}: member {name!r} is an absolute path",
                                 archive=archive, member=name)
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise UnsafeArchiveError(f"{archive}: member {name!r} contains '..'", archive=archive, member=name)
    return PurePosixPath(*[p for p in parts if p != "."]) if parts else PurePosixPath(".")


def task_name_of(parts: list[tuple[str, ...]], name: str | None, archive: str) -> tuple[str, bool]:
    """(task name, whether to strip the single top-level folder)."""
    tops = {ps[0] for ps in parts if ps}
    strip = len(tops) == 1 and any(len(ps) > 1 for ps in parts)
    task_name = name or (next(iter(tops)) if strip else None)
    if not task_name or "/" in task_name or task_name in (".", ".."):
        raise UnsafeArchiveError(f"{archive}: the archive has no single top folder (top-level "
                                 f"entries {sorted(tops)[:5]}); name the task with --name NAME",
                                 archive=archive, member=None)
    return task_name, strip


def free_target(dest_dir: Path, task_name: str, archive: str) -> Path:
    target = dest_dir / task_name
    if target.exists():
        raise UnsafeArchiveError(f"{archive}: {target} already exists; remove it or import "
                                 "elsewhere", archive=archive, member=None)
    return target
