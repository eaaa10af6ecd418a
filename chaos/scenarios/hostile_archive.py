"""hostile-archive: task archives are untrusted input (walkthrough section 1: one gzip tar per row).

Fault: real malicious ``.tar.gz`` files, built here with ``tarfile``: an
absolute path, a ``..`` path, a symlink to a directory outside followed by a
member written through it, a hard link to a file outside, a character device,
a fifo, a member-count bomb and a size bomb (highly compressible zeros).

- Unguarded: a naive ``tarfile.extractall(dest, filter="fully_trusted")``
  (what a plain loader did before Python's extraction filters). Observed:
  files appear outside ``dest`` (a canary dir next to it), a device node is
  created, the bomb's bytes land on disk.
- Guarded: ``rl.agent.archive.extract_task_archive`` refuses each archive with
  an ``UnsafeArchiveError`` naming the member, and the canary dir and the
  destination stay exactly as they were.
"""
from __future__ import annotations

import io
import os
import stat
import tarfile
import time
from pathlib import Path
from typing import Callable

from chaos.harness import Guarded, Outcome, Timeline, register
from rl.agent.archive import ArchiveLimits, extract_task_archive
from rl.errors import UnsafeArchiveError

# scaled thresholds so the bombs are cheap to build: the mechanism is the same at 64 MiB
LIMITS = ArchiveLimits(max_members=200, max_total_bytes=4 * 2**20, max_member_bytes=2 * 2**20)
BOMB_BYTES = 8 * 2**20


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", **attrs) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in attrs.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data) if data else None)


def _task_prefix(tar: tarfile.TarFile) -> None:
    _add(tar, "task", type=tarfile.DIRTYPE, mode=0o755)
    _add(tar, "task/instruction.md", b"do it\n")


def hostile_builders(outside: Path) -> dict[str, Callable[[tarfile.TarFile], None]]:
    """name -> function adding that attack's members (after a benign task prefix)."""
    def absolute(t):
        _add(t, str(outside / "abs-pwned.txt"), b"pwned\n")

    def dotdot(t):
        _add(t, f"task/../../../{outside.name}/dotdot-pwned.txt", b"pwned\n")   # dest = tmp/naive/<name>

    def symlink_escape(t):
        _add(t, "task/out", type=tarfile.SYMTYPE, linkname=str(outside))
        _add(t, "task/out/link-pwned.txt", b"pwned\n")

    def relative_symlink_escape(t):
        _add(t, "task/up", type=tarfile.SYMTYPE, linkname=f"../../../{outside.name}")
        _add(t, "task/up/rel-link-pwned.txt", b"pwned\n")

    def hardlink_escape(t):
        _add(t, "task/hard", type=tarfile.LNKTYPE, linkname=str(outside / "victim.txt"))

    def device(t):
        _add(t, "task/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666)

    def fifo(t):
        _add(t, "task/pipe", type=tarfile.FIFOTYPE, mode=0o644)

    def member_bomb(t):
        for i in range(LIMITS.max_members + 50):
            _add(t, f"task/f{i:05d}", b"")

    def size_bomb(t):
        info = tarfile.TarInfo("task/zeros.bin")
        info.size = BOMB_BYTES
        t.addfile(info, _Zeros(BOMB_BYTES))

    return {f.__name__: f for f in (absolute, dotdot, symlink_escape, relative_symlink_escape,
                                     hardlink_escape, device, fifo, member_bomb, size_bomb)}


class _Zeros(io.RawIOBase):
    """A readable stream of n zero bytes (the bomb is never held in memory)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k


def build(path: Path, add: Callable[[tarfile.TarFile], None]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        _task_prefix(tar)
        add(tar)
    return path


def _snapshot(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        kind = "dev" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else \
            "fifo" if stat.S_ISFIFO(st.st_mode) else "link" if p.is_symlink() else \
            "dir" if p.is_dir() else "file"
        out[str(p.relative_to(root))] = f"{kind}:{st.st_size if kind == 'file' else 0}"
    return out


def _unguarded(archive: Path, dest: Path, outside: Path) -> str:
    before = _snapshot(outside)
    dest.mkdir(parents=True)
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="fully_trusted")
    except (OSError, tarfile.TarError) as e:
        return f"error {type(e).__name__}: {e}"[:160]
    escaped = sorted(set(_snapshot(outside).items()) - set(before.items()))
    inside = _snapshot(dest)
    special = [k for k, v in inside.items() if v.startswith(("dev", "fifo"))]
    big = sum(int(v.split(":")[1]) for v in inside.values() if v.startswith("file"))
    parts = []
    if escaped:
        parts.append(f"wrote outside dest: {[k for k, _ in escaped]}")
    if special:
        parts.append(f"created special files {special}")
    if big > LIMITS.max_total_bytes or len(inside) > LIMITS.max_members:
        parts.append(f"extracted {len(inside)} entries, {big} bytes")
    hard = dest / "task" / "hard"
    if hard.exists() and os.path.samefile(hard, outside / "victim.txt"):
        parts.append("hard link aliases a file outside dest (writes go through)")
    return "; ".join(parts) or "extracted without visible harm"


@register("hostile-archive", "untrusted task archives escape the destination or exhaust the host")
def run(tmp: Path) -> Outcome:
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("original\n")
    unguarded, guarded, details = {}, {}, {}
    caught_all, clean, t_detect = True, True, 0.0
    tl = Timeline()  # the slowest refusal: from its extraction's start to the refusal, then the host checked clean
    slowest = (-1.0, 0.0, 0.0)
    for name, add in hostile_builders(outside).items():
        arc = build(tmp / f"{name}.tar.gz", add)
        unguarded[name] = _unguarded(arc, tmp / "naive" / name, outside)
        for leftover in set(_snapshot(outside)) - {"victim.txt"}:   # reset the canary dir
            p = outside / leftover
            p.unlink() if not p.is_dir() or p.is_symlink() else None
        (outside / "victim.txt").write_text("original\n")
        before, dest = _snapshot(outside), tmp / "pool"
        dest.mkdir(exist_ok=True)
        t0 = time.monotonic()
        try:
            extract_task_archive(arc, dest, limits=LIMITS)
            guarded[name], ok = "ACCEPTED", False
        except UnsafeArchiveError as e:
            t_detect = max(t_detect, time.monotonic() - t0)
            refused_at = time.monotonic()
            guarded[name], ok = str(e), e.context.get("member") is not None or name == "size_bomb"
        caught_all &= ok
        was_clean = _snapshot(outside) == before and not any(dest.iterdir())
        clean &= was_clean
        if guarded[name] != "ACCEPTED" and was_clean and refused_at - t0 > slowest[0]:
            slowest = (refused_at - t0, t0, time.monotonic())
    if slowest[0] >= 0:
        tl.fault(at=slowest[1])
        tl.after_fault(detected=slowest[0], healthy=slowest[2] - slowest[1])
    fired = sum("outside" in v or "special" in v or "entries" in v or "hard link" in v
                for v in unguarded.values())
    details = {"unguarded": unguarded, "guarded": guarded, "num_attacks": len(unguarded),
               "num_unguarded_harmful": fired}
    return Outcome(
        fault_fired=fired >= len(unguarded) - 1,
        unguarded="; ".join(f"{k}: {v}" for k, v in unguarded.items())[:1500],
        guarded=Guarded(caught=caught_all, detection_s=t_detect, error=guarded.get("symlink_escape", "")),
        invariants={"unguarded_extraction_harmed_the_host": fired >= len(unguarded) - 1,
                    "nothing_written_outside_dest": clean, "every_refusal_names_member": caught_all},
        details=details,
        recovery=tl.recovery(how="refused before a byte was written; the host checked clean (nothing to undo)"))
