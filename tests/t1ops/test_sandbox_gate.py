"""`t1ops doctor` reports the trial isolation; `t1ops run` refuses weaker isolation than asked."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import rl.agent.sandbox as sandbox_mod
from rl.agent.sandbox.isolation import probe_isolation
from rl.errors import SandboxError
from t1ops.cli import main
from t1ops.config import CampaignConfig

REPO = Path(__file__).resolve().parents[2]


def test_doctor_json_reports_uid_drop_namespaces_and_cgroup(capsys):
    main(["doctor", "--json"])
    (iso,) = [c for c in json.loads(capsys.readouterr().out) if c["name"] == "sandbox_isolation"]
    facts = iso["facts"]
    assert iso["status"] == "ok" and facts["level"] == "strict"
    assert facts["uid_drop"] is True and {"mount", "pid", "net", "ipc"} <= set(facts["namespaces"])
    assert facts["cgroup"] is True and "cgroup" in facts["limits"]


def test_run_refuses_weaker_isolation_than_the_config_asks(tmp_path, monkeypatch):
    weaker = dataclasses.replace(probe_isolation(), level="namespaces", cgroup=False,
                                 cgroup_reason="no cgroup v1 hierarchy (test)")
    monkeypatch.setattr(sandbox_mod, "probe_isolation", lambda: weaker)
    from t1ops.campaign.launch import run_campaign

    cfg = CampaignConfig.model_validate({"rollout": {"tasks_dir": str(REPO / "examples" / "tasks")}})
    with pytest.raises(SandboxError, match="'strict' is required"):
        run_campaign(cfg, out_dir=str(tmp_path / "runs"), show_progress=False)
    assert not (tmp_path / "runs").exists()          # refused before anything started
    lenient = cfg.model_copy(update={"sandbox": cfg.sandbox.model_copy(update={"isolation": "namespaces"})})
    assert sandbox_mod.require_isolation(lenient.sandbox.isolation) is weaker


def test_config_knobs_reach_the_trial_limits_and_cgroup(tmp_path):
    from rl.agent.tasks import load_task

    sb = sandbox_mod.make_sandbox(tmp_path, "r", {"cpus": 0.5, "storage_mb": 64, "num_procs": 32,
                                                  "memory_mb": 300, "isolation": "strict"})
    trial = sb.create(load_task(REPO / "examples" / "tasks" / "files-hello"), 0)
    try:
        cg = trial.cgroup.dirs
        assert (cg["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert (cg["pids"] / "pids.max").read_text().strip() == "32"
        assert "size=65536k" in Path("/proc/self/mounts").read_text().split(str(trial.fs))[1].split("\n")[0]
    finally:
        trial.close()
