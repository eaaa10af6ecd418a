"""`t1ops audit` ends with PASS or FAIL and a one-line reason (issue 55)."""
from __future__ import annotations

from t1ops.cli import main
from tests.t1ops.test_audit import make_traj, write_trajectory


def test_audit_ends_with_pass_or_fail_and_why(tmp_path, capsys):
    write_trajectory(make_traj(5, "ok"), tmp_path)
    assert main(["audit", str(tmp_path)]) == 0
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith("PASS: no drift in 1 trajectories' loss regions") and "not checked" in out[-1]
    assert any(line.startswith("placeholder ") and "borrowed" in line for line in out)
    write_trajectory(make_traj(6, "bad", drift=2), tmp_path)
    assert main(["audit", str(tmp_path)]) == 1
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last == "FAIL: 2 loss token(s) differ from the stream's own engine_tokens"
