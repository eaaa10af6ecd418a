"""Issue #51, class 5: t1ops' own parsers and printers are bounded. Each input is the issue's or
one built here; each must end in a refusal naming the file (one line), never a traceback, and
nothing a trial printed may reach the operator's terminal as a control sequence."""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rl.errors import ParseError
from t1ops.cli import main
from tests.rl.test_sandbox_attack_classes import _one_line, _task

# --- .npz dumps: no pickles, shapes checked against the file before any allocation -------------


def _npz(path: Path, members: dict[str, bytes], compress=zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compress) as z:
        for name, data in members.items():
            z.writestr(f"{name}.npy", data)
    return path


def _npy_header(shape: tuple, dtype: str) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.dtype(dtype).str if dtype != "O" else "|O",
                                               "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _real(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _others() -> dict[str, bytes]:
    names = ("loss_mask", "rollout_logprobs", "engine_tokens", "origin", "policy_version", "routing")
    return {**{k: _real(np.zeros(3, np.int64)) for k in names}, "meta": _real(np.array('{"relations": []}'))}


@pytest.mark.parametrize("case", ["issue-8TiB-header", "own-object-dtype", "own-zero-filled-over-the-cap",
                                  "own-stored-size-lie"])
def test_audit_refuses_hostile_npz_before_allocating(tmp_path, monkeypatch, capsys, case):
    from t1ops import audit_npz

    if case == "issue-8TiB-header":   # 1.5 KB declaring an 8 TiB array
        _npz(tmp_path / "x.c0.npz", {"tokens": _npy_header((2**40,), "<i8") + b"\0" * 1024, **_others()})
        want = "declares shape"
    elif case == "own-object-dtype":
        _npz(tmp_path / "x.c0.npz", {"tokens": _npy_header((3,), "O") + b"\x80\x04N." * 3, **_others()})
        want = "holds Python objects"
    elif case == "own-zero-filled-over-the-cap":   # a real array, honest header, too big to load
        monkeypatch.setattr(audit_npz, "MAX_DUMP_BYTES", 2**20)
        _npz(tmp_path / "x.c0.npz", {"tokens": _real(np.zeros(2**18, np.int64)), **_others()})
        want = "hold over"
    else:
        data = _npy_header((2**30,), "<i8") + b"\0" * 64
        _npz(tmp_path / "x.c0.npz", {"tokens": data, **_others()}, compress=zipfile.ZIP_STORED)
        with zipfile.ZipFile(tmp_path / "x.c0.npz") as z:
            assert z.getinfo("tokens.npy").file_size == len(data)
        want = "declares shape"
    assert (tmp_path / "x.c0.npz").stat().st_size < 8 * 2**20
    from t1ops.audit import audit_dump

    with pytest.raises(ParseError, match=want) as refused:
        audit_dump(tmp_path)
    assert "x.c0.npz" in _one_line(refused.value)
    assert main(["audit", str(tmp_path)]) != 0          # the command: a refusal, no traceback
    err = capsys.readouterr().err
    assert "Traceback" not in err and "x.c0.npz" in err


# --- compare on a hostile summary.json ------------------------------------------------------


@pytest.mark.parametrize("summary", [
    '{"eval": [{"step": 0}, {"step": 1, "eval_trial_rewards": 5}]}',                # the kind: wrong types
    '{"eval": "x"}',                                                                # own: a string for a list
    "[" * 100_000 + "]" * 100_000,                                                  # own: nesting
    '{"eval": [{"step": 0, "eval_reward_mean": NaN, "eval_reward_sem": 0, "eval_num_trials": 1}] }',  # own: NaN
    '[1, 2]',                                                                       # own: not an object
    '{"config": 3, "eval": []}',                                                    # own: config not a table
    '\udcff',                                                                       # own: not UTF-8
])
def test_compare_refuses_a_hostile_summary_naming_the_file(tmp_path, capsys, summary):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_bytes(summary.encode("utf-8", errors="surrogateescape"))
    rc = main(["compare", str(run), "--no-plot"])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err and "summary.json" in err, err[-2000:]


def test_compare_prints_config_values_with_their_control_characters_escaped(tmp_path, capsys):
    evil = "t\x1b]0;owned\x07\x1b[2J"
    evals = [{"step": s, "eval_trial_rewards": {"text-sort": [0.1 * s, 0.2]}} for s in (0, 5)]
    for name, value in (("a", "plain"), ("b", evil)):   # the second config's label names its value
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"eval": evals, "config": {"x": value}}))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--no-plot"]) == 0
    out = capsys.readouterr()
    assert "\x1b" not in out.out + out.err and "x=t\\x1b]0;owned" in out.out


# --- TOML depth and environment variable names -------------------------------------------------


def test_a_deeply_nested_campaign_toml_is_a_refusal_not_a_recursion_error(tmp_path, capsys):
    cfg = tmp_path / "deep.toml"
    cfg.write_text("[x]\ny = " + "[" * 5000 + "]" * 5000 + "\n")          # the issue's
    assert main(["config", str(cfg)]) != 0
    err = capsys.readouterr().err
    assert "nests deeper" in err and "Traceback" not in err and "RecursionError" not in err
    cfg.write_text("[x]\ny = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n")   # own: inline tables
    assert main(["config", str(cfg)]) != 0 and "nests deeper" in capsys.readouterr().err
    from t1ops.errors import ConfigError
    from t1ops.overrides import parse_assignments

    with pytest.raises(ConfigError, match="nests deeper"):                  # own: a --set value
        parse_assignments(["trainer.x=" + "[" * 5000 + "]" * 5000])


@pytest.mark.parametrize("table, key", [("environment.env", '"A=B"'),           # the issue's
                                        ("environment.env", '"1ABC"'),          # own: not a name
                                        ("verifier.env", '"PATH=/x:/y"'),       # own: the verifier's table
                                        ("solution.env", '"A B"')])             # own: a space
def test_env_names_a_process_cannot_hold_are_refused_by_import_and_check(tmp_path, table, key):
    from t1ops.task_import import do_check, do_import

    src = _task(tmp_path, toml_extra=f'\n[{table}]\n{key} = "v"\n')
    report = do_check(src)
    assert not report.ok and table in _one_line(report.refused[0]["message"])
    assert not do_import([src], tmp_path / "imported").ok


# --- what a trial printed reaches the operator only as text ----------------------------------------


def test_the_first_failed_test_line_reaches_the_terminal_escaped():
    """The issue's: escape sequences an agent prints reach the operator's terminal through the
    "first failed test" line. Own: a bidi override and a C1 CSI in a refusal message."""
    from rl.agent.bounded import short
    from rl.agent.container.diagnose import verifier_reasons
    from t1ops.task_runs import _row

    [why] = verifier_reasons("FAILED test_x.py::test_a - \x1b]0;pwned\x07\x1b[2J\x1b[1;1Hall good", "")
    assert "\x1b" not in why and "\x07" not in why and "\\x1b]0;pwned" in why
    row = _row("t", reason="solution: \u202egnp.exe\x9b31m")
    assert "\u202e" not in row["reason"] and "\x9b" not in row["reason"]
    assert short("a\x1b[31mb\x00c") == "a\\x1b[31mb\\x00c"
