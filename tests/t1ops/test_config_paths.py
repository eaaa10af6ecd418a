"""A config a team can check before launch: paths relative to the config file, `t1ops config`
on several files with --set, errors that point to the fix, `t1ops run --dry-run` (issue 55)."""
from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from t1ops.cli import main
from t1ops.config import load_config, load_toml, parse_config
from t1ops.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny" / "campaign.toml"


def test_relative_paths_follow_the_config_file_not_the_shell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # another working directory: the pool is still found
    cfg = load_toml(TINY)
    assert cfg.rollout.tasks_dir == str(REPO / "examples" / "families" / "train")
    assert cfg.eval.tasks_dir == str(REPO / "examples" / "families" / "heldout")
    assert cfg.harness.program_dir == str(REPO / "examples" / "harness")  # a default: the repository's
    # a copy elsewhere reads the pool beside it; --set paths follow the working directory
    (tmp_path / "cfg").mkdir()
    (tmp_path / "pool").mkdir()
    (tmp_path / "cfg" / "c.toml").write_text('[rollout]\ntasks_dir = "../pool"\n')
    loaded = load_config(tmp_path / "cfg" / "c.toml")
    assert loaded.config.rollout.tasks_dir == str(tmp_path / "pool") and loaded.missing_files() == []
    over = load_config(tmp_path / "cfg" / "c.toml", overrides=[("rollout.tasks_dir", "pool2")])
    assert over.config.rollout.tasks_dir == str(tmp_path / "pool2")
    problem, = over.missing_files()
    assert str(tmp_path / "pool2") in problem and "relative to the working directory" in problem


def test_every_shipped_campaign_names_existing_paths(tmp_path):
    from t1ops.commands.model import init_checkpoint

    checkpoint = None
    for f in sorted((REPO / "examples").glob("*/campaign*.toml")) + sorted((REPO / "examples" / "recipes").glob("*.toml")):
        overrides = None
        if "path" in tomllib.loads(f.read_text()).get("model", {}):
            # [model] path names a checkpoint the user writes first (`t1ops model init`, as the file says);
            # a fresh clone has none, so every other path is checked with one written here
            checkpoint = checkpoint or init_checkpoint("qwen3_5_moe", str(tmp_path / "ckpt"),
                                                       vocab_size=4096, max_seq_len=1024)
            overrides = [("model.path", checkpoint)]
        assert load_config(f, overrides=overrides).missing_files() == [], f


def test_config_command_reports_every_file_and_takes_set(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[rollout]\ntasks_dir = "nowhere"\n')
    typo = tmp_path / "typo.toml"
    typo.write_text("[trainer]\nactr_lr = 1e-4\n")
    assert main(["config", str(bad), str(TINY), str(typo)]) == 1
    out, err = capsys.readouterr()
    assert f"{TINY}: ok" in out and "1/3 config files ok" in err
    assert f"directory {tmp_path / 'nowhere'} does not exist" in err and "config file's directory" in err
    assert "did you mean 'trainer.actor_lr'?" in err and "`t1ops config`" in err and "--help" not in err
    assert main(["config", str(TINY), "--set", "rollout.batch_size=16"]) == 0
    assert main(["config", str(TINY), "--set", "rollout.batch_size=17"]) == 1
    assert "multiple of rollout.n_samples_per_prompt" in capsys.readouterr().err


def test_errors_name_the_key_the_fix_and_no_validator_internals():
    with pytest.raises(ConfigError) as err:
        parse_config({"rollout": {"batch_size": 6, "n_samples_per_prompt": 4}})
    assert "<root>" not in str(err.value) and "Value error" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_config({"trainer": {"tasks_dir": "x"}})  # the right name in the wrong section
    assert "did you mean 'rollout.tasks_dir' or 'eval.tasks_dir'?" in str(err.value)


def test_a_campaign_given_as_a_plan_says_so(capsys):
    assert main(["preflight", str(TINY)]) == 1
    err = capsys.readouterr().err
    assert "is a campaign config, not a cluster plan" in err and "unknown key" not in err
    assert main(["preflight", "--schema"]) == 0 and "parallelism." in capsys.readouterr().out


def test_dry_run_prints_sources_and_checks_without_a_run_dir(tmp_path, capsys):
    assert main(["run", str(TINY), "--set", "trainer.actor_lr=1e-4", "--out", str(tmp_path / "runs"),
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    toml_part = out.split("pre-start checks")[0]
    data = tomllib.loads(toml_part)  # the effective config is TOML
    assert data["trainer"]["actor_lr"] == 1e-4 and data["rollout"]["tasks_dir"].endswith("families/train")
    lines = {ln.split("=")[0].strip(): ln for ln in toml_part.splitlines() if "=" in ln and not ln.startswith("#")}
    assert lines["actor_lr"].endswith("# --set") and lines["batch_size"].endswith("# file")
    assert lines["lr_schedule"].endswith("# default")
    for check in ("paths", "isolation", "task_pool", "layout", "run_dir", "memory", "nofile"):
        assert f"  {check}" in out
    assert "dry run: PASS" in out and not (tmp_path / "runs").exists()


def test_dry_run_fails_on_a_missing_pool(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    shutil.copy(TINY, cfg)  # its ../families/train is not beside the copy
    assert main(["run", str(cfg), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert f"directory {tmp_path.parent / 'families' / 'train'} does not exist" in out
    assert "dry run: FAIL" in out
