"""rl.atomic: the one temp-then-rename helper fsyncs the file and its directory."""
from __future__ import annotations

import os

import pytest

from rl import atomic


def _record_fsyncs(monkeypatch) -> list[str]:
    seen: list[str] = []
    real = os.fsync

    def spy(fd):
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", spy)
    return seen


def test_publish_file_fsyncs_the_file_and_the_directory(tmp_path, monkeypatch):
    seen = _record_fsyncs(monkeypatch)
    path = atomic.publish_file(tmp_path / "sub" / "x.json", '{"a": 1}')
    assert path.read_text() == '{"a": 1}' and sorted(p.name for p in path.parent.iterdir()) == ["x.json"]
    assert any(s.endswith(".tmp") for s in seen) and str(tmp_path / "sub") in seen  # file, then the rename's dir
    seen.clear()
    atomic.publish_file(path, b"beat", durable=False)  # a liveness beacon: atomic, no fsync
    assert path.read_bytes() == b"beat" and seen == []


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = atomic.publish_file(tmp_path / "x", "old")

    def boom(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic.publish_file(path, boom)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x"]


def test_publish_dir_fsyncs_every_file_and_refuses_to_half_exist(tmp_path, monkeypatch):
    seen = _record_fsyncs(monkeypatch)
    final = atomic.publish_dir(tmp_path / "step_1", lambda d: ((d / "a").write_text("1"), (d / "b").write_text("2")))
    assert sorted(p.name for p in final.iterdir()) == ["a", "b"]
    assert sum(s.endswith(("/a", "/b")) for s in seen) == 2 and str(tmp_path) in seen

    def boom(d):
        (d / "a").write_text("1")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic.publish_dir(tmp_path / "step_2", boom)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]  # no step_2, no temp dir
