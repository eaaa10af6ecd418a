"""`t1ops tasks import|check`: safe extraction end to end, refusals name the member, exit codes."""
from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

import pytest

from chaos.scenarios.hostile_archive import build, hostile_builders
from rl.agent.archive import ArchiveLimits, extract_task_bytes, pack_task
from rl.errors import UnsafeArchiveError
from t1ops.commands import tasks as cmd

POOL = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def _run(*argv: str) -> tuple[int, dict]:
    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    args = p.parse_args([*argv, "--json"])
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cmd.run(args)
    return rc, json.loads(buf.getvalue())


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_import_good_archive_then_check(tmp_path):
    arc = tmp_path / "text-sort.tar.gz"
    arc.write_bytes(pack_task(POOL / "text-sort"))
    rc, out = _run("import", str(arc), "--into", str(tmp_path / "pool"))
    assert rc == 0 and [r["task"] for r in out["ok"]] == ["text-sort"]
    rc, out = _run("check", str(tmp_path / "pool"))
    assert rc == 0 and out["ok"][0]["family"] == "text"


def test_check_shipped_pool_and_reports_missing(tmp_path):
    rc, out = _run("check", str(POOL))
    assert rc == 0 and len(out["ok"]) >= 24
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "task.toml").write_text("[agent]\ntimeout_sec = 1\n")
    rc, out = _run("check", str(bad))
    assert rc == 1 and "instruction.md" in out["refused"][0]["message"]


@pytest.mark.parametrize("attack", sorted(hostile_builders(Path("/x"))))
def test_each_hostile_archive_is_refused_naming_member_and_writes_nothing(tmp_path, attack):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("original\n")
    arc = build(tmp_path / f"{attack}.tar.gz", hostile_builders(outside)[attack])
    before = _snapshot(tmp_path)
    rc, out = _run("import", str(arc), "--into", str(tmp_path / "pool"), "--max-members", "200",
                   "--max-total-mb", "4", "--max-member-mb", "2")
    assert rc == 1 and out["refused"][0]["error"] == "UnsafeArchiveError"
    assert out["refused"][0]["member"] or attack == "size_bomb"
    assert _snapshot(tmp_path) - before <= {"pool"}          # only the (empty) destination
    assert not any((tmp_path / "pool").iterdir())
    assert (outside / "victim.txt").read_text() == "original\n"


def test_jsonl_rows_import_and_refuse_bad_names(tmp_path):
    blob = base64.b64encode(pack_task(POOL / "math-add")).decode()
    rows = [{"path": "math-add", "task_binary": blob},
            {"path": "../escape", "task_binary": blob},
            {"path": "broken", "task_binary": "!!notbase64"}]
    ds = tmp_path / "ds.jsonl"
    ds.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rc, out = _run("import", str(ds), "--into", str(tmp_path / "pool"))
    assert rc == 1 and [r["task"] for r in out["ok"]] == ["math-add"]
    assert len(out["refused"]) == 2 and not (tmp_path / "escape").exists()


def test_parquet_without_pyarrow_says_so(tmp_path):
    try:
        import pyarrow  # noqa: F401
        pytest.skip("pyarrow is installed here")
    except ImportError:
        pass
    ds = tmp_path / "ds.parquet"
    ds.write_bytes(b"PAR1")
    rc, out = _run("import", str(ds), "--into", str(tmp_path / "pool"))
    assert rc == 1 and "pyarrow" in out["refused"][0]["message"]


def test_archive_that_is_not_a_task_is_removed_after_extraction(tmp_path):
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("junk/readme.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    arc = tmp_path / "junk.tar.gz"
    arc.write_bytes(buf.getvalue())
    rc, out = _run("import", str(arc), "--into", str(tmp_path / "pool"))
    assert rc == 1 and not (tmp_path / "pool" / "junk").exists()


def test_existing_target_and_garbage_bytes_are_refused(tmp_path):
    data = pack_task(POOL / "files-hello")
    extract_task_bytes(data, tmp_path)
    with pytest.raises(UnsafeArchiveError, match="already exists"):
        extract_task_bytes(data, tmp_path)
    with pytest.raises(UnsafeArchiveError):
        extract_task_bytes(b"\x1f\x8b garbage", tmp_path, name="x")
    with pytest.raises(UnsafeArchiveError, match="compressed bytes"):
        extract_task_bytes(data, tmp_path, name="y", limits=ArchiveLimits(max_compressed_bytes=10))
