"""`t1ops explain ID` for every catalogue id; guards declare the ids they catch (CATCHES)."""
from __future__ import annotations

import pytest

from t1ops.cli import main
from t1ops.errors import ConfigError
from t1ops.explain import REPO, Entry, catalogue, consistency_errors, declarations, explain


def test_every_catalogue_id_has_a_declaring_guard_and_the_table_agrees():
    cat = catalogue()
    assert len(cat) >= 20  # the table parsed (a broken parse would make the check vacuous)
    assert consistency_errors() == []


def test_the_check_fails_on_an_undeclared_id_a_stray_declaration_and_a_bad_key():
    cat = {"new-failure": Entry("new-failure", "x", "y", "t1ops/guards/new.py"),
           "dead-engine": Entry("dead-engine", "x", "y", "t1ops/engines/health.py")}
    decls = {"t1ops/guards/other.py": {"dead-engine": ("engine.no_such_key",), "not-catalogued": ()}}
    errors = "\n".join(consistency_errors(cat, decls))
    assert "'new-failure' has no guard that declares it" in errors
    assert "declares 'not-catalogued'" in errors and "'engine.no_such_key', which does not exist" in errors
    assert "names t1ops/engines/health.py, declared by ['t1ops/guards/other.py']" in errors


def test_explain_prints_guard_scenario_runbook_and_config_for_every_id(capsys):
    for fid, entry in catalogue().items():
        text = explain(fid)
        assert entry.guard_module in text and f"t1ops chaos run {fid}" in text, fid
        assert (REPO / "runbooks" / f"{fid}.md").is_file() and f"runbooks/{fid}.md" in text
        assert (REPO / "chaos" / "scenarios" / f"{fid.replace('-', '_')}.py").is_file()
    assert "engine.warmup_grace_s = 120.0" in explain("engine-warmup-grace")
    assert "governs: dead-engine, engine-warmup-grace" in explain("engine.failure_threshold")
    assert sum(len(c) for c in declarations().values()) == len(catalogue())
    with pytest.raises(ConfigError, match="did you mean"):
        explain("dead-engin")
    assert main(["explain", "coordinator-crash"]) == 0
    assert "t1ops/campaign/resume.py" in capsys.readouterr().out
