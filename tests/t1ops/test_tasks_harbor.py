"""`t1ops tasks import|check` on real-layout archives: tar.gz, zip, no top folder, the older
Terminal-Bench layout, and every problem of every task reported."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import stat
import zipfile
from pathlib import Path

import pytest

from rl.agent.archive import extract_task_bytes
from rl.errors import UnsafeArchiveError
from t1ops.commands import tasks as cmd

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"


def _run(*argv: str) -> tuple[int, dict]:
    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    args = p.parse_args([*argv, "--json"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cmd.run(args)
    return rc, json.loads(buf.getvalue())


def test_tar_and_zip_real_layout_archives_import_and_check(tmp_path):
    pool = tmp_path / "pool"
    rc, out = _run("import", str(FIX / "archives" / "hello-app.tar.gz"), "--into", str(pool))
    assert rc == 0 and [r["task"] for r in out["ok"]] == ["hello-app"]
    rc, out = _run("import", str(FIX / "archives" / "count-words.zip"), "--into", str(pool))
    assert rc == 1 and "--name" in out["refused"][0]["message"] and not (pool / "count-words").exists()
    rc, out = _run("import", str(FIX / "archives" / "count-words.zip"), "--name", "count-words",
                   "--into", str(pool))
    assert rc == 0 and (pool / "count-words" / "tests" / "test.sh").stat().st_mode & stat.S_IXUSR
    rc, out = _run("check", str(pool))
    rows = {r["task"]: r for r in out["ok"]}
    assert rc == 0 and set(rows) == {"hello-app", "count-words"}
    assert all(r["runs_locally"] for r in rows.values())
    assert "metadata.reward_type (free-form metadata, kept)" in rows["hello-app"]["ignored"]
    assert any(i.startswith("task ") for i in rows["hello-app"]["ignored"])


def test_check_sorts_the_pool_into_local_and_needs_container():
    rc, out = _run("check", str(FIX / "pool"))
    rows = {r["task"]: r for r in out["ok"]}
    assert rc == 0 and not rows["needs-container"]["runs_locally"]
    assert rows["needs-container"]["needs"][0].startswith("needs a container runtime (line 3: RUN")
    assert [t for t, r in rows.items() if r["runs_locally"]] == ["count-words", "exit-zero-no-verdict",
                                                                  "hello-app", "memory-bound"]


def test_older_terminal_bench_layout_is_converted_on_import(tmp_path):
    rc, out = _run("import", str(FIX / "archives" / "tb-sum.tar.gz"), "--into", str(tmp_path))
    assert rc == 0 and out["ok"][0]["notes"][0].startswith("converted from the Terminal-Bench")
    root = tmp_path / "tb-sum"
    assert sorted(p.name for p in root.iterdir()) == ["environment", "instruction.md", "solution",
                                                      "task.toml", "tests"]
    assert (root / "environment" / "Dockerfile").is_file()
    assert "--ctrf /logs/verifier/ctrf.json" in (root / "tests" / "test.sh").read_text()
    rc, out = _run("import", str(FIX / "legacy" / "tb-sum"), "--name", "tb-sum-2", "--into", str(tmp_path))
    assert rc == 0 and (tmp_path / "tb-sum-2" / "task.toml").is_file()
    assert (FIX / "legacy" / "tb-sum" / "task.yaml").is_file()      # the source is left alone


def test_legacy_task_in_a_pool_is_named_with_the_fix(tmp_path):
    import shutil
    shutil.copytree(FIX / "legacy" / "tb-sum", tmp_path / "tb-sum")
    rc, out = _run("check", str(tmp_path))
    assert rc == 1 and "t1ops tasks import" in out["refused"][0]["message"]


def test_check_reports_every_problem_of_every_task(tmp_path):
    for name in ("a", "b"):
        d = tmp_path / name
        (d / "tests").mkdir(parents=True)
        (d / "task.toml").write_text("[agent]\ntimeout_sec = -1\n[environment]\ncpus = 'many'\n")
    rc, out = _run("check", str(tmp_path))
    assert rc == 1 and len(out["refused"]) == 2 * 3      # missing files, timeout, cpus
    text = " ".join(r["message"] for r in out["refused"])
    assert "agent.timeout_sec" in text and "environment.cpus" in text and "instruction.md" in text


def _zip(path: Path, members: list[tuple[str, bytes, int]]) -> bytes:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, data)
    return path.read_bytes()


_REG = stat.S_IFREG | 0o644
_LNK = stat.S_IFLNK | 0o777


@pytest.mark.parametrize("members, what", [
    ([("/abs/x", b"1", _REG)], "absolute"),
    ([("t/../../x", b"1", _REG)], ".."),
    ([("t/l", b"../../etc", _LNK)], "outside"),
    ([("t/a", b"b", _LNK), ("t/b", b"..", _LNK)], "outside"),
    ([("t/fifo", b"", stat.S_IFIFO | 0o644)], "fifo"),
    ([(f"t/{i}", b"", _REG) for i in range(30)], "member-count"),
    ([("t/big", b"x" * 5000, _REG)], "bytes"),
])
def test_zip_refusals_name_the_member_and_leave_nothing(tmp_path, members, what):
    from rl.agent.archive import ArchiveLimits
    data = _zip(tmp_path / "a.zip", members)
    dest = tmp_path / "pool"
    with pytest.raises(UnsafeArchiveError, match=what):
        extract_task_bytes(data, dest, name="t", archive="a.zip",
                           limits=ArchiveLimits(max_members=20, max_member_bytes=4096))
    assert not any(dest.iterdir())


def test_zip_link_inside_the_task_is_kept(tmp_path):
    data = _zip(tmp_path / "a.zip", [("t/data.txt", b"x", _REG), ("t/link", b"data.txt", _LNK)])
    target = extract_task_bytes(data, tmp_path / "pool", archive="a.zip")
    assert (target / "link").is_symlink() and (target / "link").read_text() == "x"
