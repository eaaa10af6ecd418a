"""Fuzzing the parsers that read outside data: task.toml, task archives, CTRF reports.

Each input either parses into something valid or raises the named T1OpsError
subclass; nothing else escapes and nothing lands outside the destination.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rl.agent.archive import ArchiveLimits, extract_task_bytes
from rl.agent.ctrf import parse_ctrf
from rl.agent.tasks import parse_task_toml
from rl.errors import ParseError, TaskError, UnsafeArchiveError

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                     st.floats(allow_nan=True), st.text(max_size=12))
_json = st.recursive(_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                    st.dictionaries(st.text(max_size=8), c, max_size=4)),
                     max_leaves=20)


@FAST
@given(st.text(max_size=300))
def test_task_toml_random_text(text):
    try:
        data = parse_task_toml(text)
    except TaskError:
        return
    assert isinstance(data, dict)


_toml_value = st.one_of(st.integers(-5, 10**6), st.floats(-10, 10**5, allow_nan=False),
                        st.text(alphabet="abc_ XY1", max_size=6), st.booleans(),
                        st.lists(st.text(alphabet="AB_z", max_size=4), max_size=3))


def _toml_text(sections):
    lines = []
    for sec, kv in sections.items():
        lines.append(f"[{sec}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in kv.items()]
    return "\n".join(lines) + "\n"


@FAST
@given(st.dictionaries(st.sampled_from(["metadata", "agent", "verifier", "environment", "extra"]),
                       st.dictionaries(st.sampled_from(["timeout_sec", "family", "memory_mb", "tags",
                                                        "required_env_keys", "max_turns", "bogus",
                                                        "allow_network"]), _toml_value, max_size=4),
                       max_size=4))
def test_task_toml_structured(sections):
    try:
        data = parse_task_toml(_toml_text(sections))
    except TaskError as e:
        assert "task.toml" in str(e)
        return
    for sec in ("agent", "verifier"):
        v = data.get(sec, {}).get("timeout_sec")
        assert v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 86_400)
    assert all(k.isidentifier() for k in data.get("environment", {}).get("required_env_keys", []))


@FAST
@given(_json)
def test_ctrf_random_json(doc):
    try:
        out = parse_ctrf(json.dumps(doc))
    except ParseError:
        return
    s = out["results"]["summary"]
    assert 0 <= s["passed"] <= s["tests"]


@FAST
@given(st.binary(max_size=200))
def test_ctrf_random_bytes(raw):
    try:
        parse_ctrf(raw)
    except ParseError:
        pass


_names = st.one_of(st.sampled_from(["task/a", "task/../x", "/abs", "task/./b", "task//c", "..", ".",
                                    "task/sub/d", "", "task/\x00n", "task/" + "x" * 120]),
                   st.text(alphabet="ab./\\-_", min_size=1, max_size=12))
_member = st.fixed_dictionaries({
    "name": _names,
    "type": st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                             tarfile.CHRTYPE, tarfile.FIFOTYPE]),
    "link": st.sampled_from(["", "a", "../..", "/etc/passwd", "task/a", "sub/../../.."]),
    "data": st.binary(max_size=40)})


def _tar(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m["name"])
            info.type, info.linkname = m["type"], m["link"]
            data = m["data"] if m["type"] == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@FAST
@given(st.lists(_member, min_size=1, max_size=6))
@example([{"name": "task/a", "type": b"1", "link": "a", "data": b""}])  # hard link to a missing member
def test_archive_random_members_stay_inside(members):
    try:
        blob = _tar(members)
    except (ValueError, UnicodeError, tarfile.TarError):
        return                       # tarfile itself cannot write such a header
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dest, canary = root / "dest", root / "canary"
        canary.mkdir()
        try:
            extract_task_bytes(blob, dest, name="t", limits=ArchiveLimits(max_members=5))
        except UnsafeArchiveError:
            pass
        assert {p.name for p in root.iterdir()} <= {"dest", "canary"}
        assert not any(canary.iterdir())
        for p in dest.rglob("*"):
            assert p.is_symlink() or p.is_file() or p.is_dir()
            if p.is_symlink():
                assert Path(os.path.realpath(p)).is_relative_to(os.path.realpath(dest))


@FAST
@given(st.binary(max_size=300))
def test_archive_random_bytes(raw):
    with tempfile.TemporaryDirectory() as tmp:
        try:
            extract_task_bytes(raw, tmp, name="t")
        except UnsafeArchiveError:
            pass


def _zip(members) -> bytes:
    import stat
    import zipfile
    modes = {tarfile.REGTYPE: stat.S_IFREG | 0o755, tarfile.DIRTYPE: stat.S_IFDIR | 0o755,
             tarfile.SYMTYPE: stat.S_IFLNK | 0o777, tarfile.LNKTYPE: stat.S_IFLNK | 0o777,
             tarfile.CHRTYPE: stat.S_IFCHR | 0o644, tarfile.FIFOTYPE: stat.S_IFIFO | 0o644}
    import warnings
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")      # duplicate names are part of the attack surface
        for m in members:
            info = zipfile.ZipInfo(m["name"] + ("/" if m["type"] == tarfile.DIRTYPE else ""))
            info.external_attr = modes[m["type"]] << 16
            data = m["link"].encode() if m["type"] in (tarfile.SYMTYPE, tarfile.LNKTYPE) else m["data"]
            zf.writestr(info, b"" if m["type"] == tarfile.DIRTYPE else data)
    return buf.getvalue()


@FAST
@given(st.lists(_member, min_size=1, max_size=6))
def test_zip_random_members_stay_inside(members):
    blob = _zip(members)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dest, canary = root / "dest", root / "canary"
        canary.mkdir()
        try:
            extract_task_bytes(blob, dest, name="t", limits=ArchiveLimits(max_members=5))
        except UnsafeArchiveError:
            pass
        assert {p.name for p in root.iterdir()} <= {"dest", "canary"}
        assert not any(canary.iterdir())
        for p in dest.rglob("*"):
            assert p.is_symlink() or p.is_file() or p.is_dir()
            if p.is_symlink():
                assert Path(os.path.realpath(p)).is_relative_to(os.path.realpath(dest))
            else:
                assert not p.stat().st_mode & 0o7000       # never setuid/setgid/sticky


@FAST
@given(st.binary(max_size=300))
def test_zip_random_bytes(raw):
    with tempfile.TemporaryDirectory() as tmp:
        try:
            extract_task_bytes(b"PK\x03\x04" + raw, tmp, name="t")
        except UnsafeArchiveError:
            pass
