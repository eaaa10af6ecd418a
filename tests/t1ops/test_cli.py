"""Smoke tests for the `t1ops` entry points (in-process and as a real console script)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

from t1ops.cli import main


def test_help_lists_commands(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    for cmd in ("doctor", "chaos", "config"):
        assert cmd in out


def test_doctor_json(capsys):
    main(["doctor", "--json"])
    checks = json.loads(capsys.readouterr().out)
    names = {c["name"] for c in checks}
    assert {"rlimit_nofile", "host_ram", "kernel_log", "ray"} <= names
    assert all(c["status"] in ("ok", "warn", "fail") for c in checks)


def test_chaos_list_json(capsys):
    assert main(["chaos", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all({"id", "title", "runbook"} <= set(r) for r in rows)


def test_config_rejects_bad_file(tmp_path, capsys):
    f = tmp_path / "c.toml"
    f.write_text("[engine]\nhealth_intervall_s = 3\n")
    assert main(["config", str(f)]) == 1
    assert "engine.health_intervall_s" in capsys.readouterr().err


def test_console_script_runs():
    exe = shutil.which("t1ops") or str(__import__("pathlib").Path(sys.executable).parent / "t1ops")
    res = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "chaos" in res.stdout


def test_an_error_raised_in_a_ray_actor_is_one_line(monkeypatch, capsys):
    """A t1ops error raised inside an actor reaches the driver as Ray's RayTaskError(X), whose text is the
    remote traceback; `t1ops` prints the cause's one line (the project's rule)."""
    from ray.exceptions import RayTaskError

    from t1ops.commands import runs
    from t1ops.errors import CheckpointError

    cause = CheckpointError("the resume-point save of step 3 left no critic checkpoint in /x: a resume would go "
                            "back to step 2; the critic save was skipped (see runbooks/critic-checkpoint-skipped.md)")
    wrapped = RayTaskError("TrainerHost.publish", "Traceback (most recent call last):\n  File \"x.py\", line 1\n",
                           cause).as_instanceof_cause()

    def raises(args):
        raise wrapped

    monkeypatch.setattr(runs, "run", raises)
    assert main(["runs"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"t1ops runs: CheckpointError: {cause}"], err
