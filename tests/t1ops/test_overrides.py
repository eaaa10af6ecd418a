"""`t1ops run CFG --set KEY=VALUE`: dotted overrides validated exactly like the file."""
from __future__ import annotations

from pathlib import Path

import pytest

from t1ops.cli import main
from t1ops.config import load_toml
from t1ops.errors import ConfigError
from t1ops.overrides import apply_overrides, parse_assignments, parse_value

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny" / "campaign.toml"


def test_values_are_toml_or_bare_text():
    assert parse_value("1e-6") == 1e-6 and parse_value("true") is True and parse_value("8") == 8
    assert parse_value("fully_async") == "fully_async" and parse_value('"x y"') == "x y"
    assert parse_value("['a', 'b']") == ["a", "b"]
    assert apply_overrides({"run": {"steps": 3}}, [("run.steps", 5), ("trainer.parallel.dp", 2)]) == \
        {"run": {"steps": 5}, "trainer": {"parallel": {"dp": 2}}}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_assignments(["trainer.actor_lr"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_overrides({"run": {"steps": 3}}, [("run.steps.x", 1)])


def test_overrides_apply_and_are_validated_like_the_file():
    cfg = load_toml(TINY, overrides=parse_assignments(["trainer.actor_lr=1e-6", "run.mode=fully_async"]))
    assert cfg.trainer.actor_lr == 1e-6 and cfg.pipeline_mode == "fully_async"
    assert load_toml(TINY).trainer.actor_lr == 3e-4  # the file itself is untouched
    for bad, says in ((["trainer.actor_lr=fast"], "trainer.actor_lr"),   # strict types
                      (["run.steps=0"], "greater than or equal to 1"),  # ranges
                      (["trainer.actor_lrr=1"], "unknown key 'trainer.actor_lrr'"),
                      (["run.one_step_pipeline=false"], "renamed: use 'run.mode")):  # a renamed key names the new one
        with pytest.raises(ConfigError, match=says):
            load_toml(TINY, overrides=parse_assignments(bad))


def test_run_command_refuses_a_bad_override_before_anything_starts(capsys):
    assert main(["run", str(TINY), "--set", "run.mode=fully-async"]) != 0
    err = capsys.readouterr().err
    assert "run.mode" in err and "fully_async" in err  # names the key and what is allowed
