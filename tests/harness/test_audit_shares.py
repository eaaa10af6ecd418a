"""`t1ops audit` token shares come from the recorded turn relations (meta turn_spans)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl.chat import IM_END_ID, ChatRenderer, render_text
from rl.tito import TitoBuilder
from t1ops.audit import audit_dump, write_trajectory


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer.default()


def _harness_like(renderer, sample_id: str, compact_args: bool):
    """Two turns; the second prompt re-serialises the first call's arguments if ``compact_args``."""
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "make out.txt"}]
    p1 = renderer.encode(render_text(msgs, True))
    reply = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi > out.txt"}}\n</tool_call>'
    o1 = renderer.encode(reply) + [IM_END_ID]
    b = TitoBuilder(p1, sample_id=sample_id, group_id="g", tokenizer=renderer.tokenizer)
    b.add_generation(o1, [-0.1] * len(o1), policy_version=0)
    args = '{"command":"echo hi > out.txt"}' if compact_args else '{"command": "echo hi > out.txt"}'
    msgs += [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "bash", "arguments": args}}]},
             {"role": "tool", "content": "[exit code 0]"}]
    p2 = renderer.encode(render_text(msgs, True))
    o2 = renderer.encode("Done.") + [IM_END_ID]
    rel = b.add_turn(p2, o2, [-0.2] * len(o2), policy_version=0)
    return rel, b.finish()


def test_shares_by_relation_per_run_and_per_trial(renderer, tmp_path):
    rel_a, chunks_a = _harness_like(renderer, "a", compact_args=True)
    rel_b, chunks_b = _harness_like(renderer, "b", compact_args=False)
    assert (rel_a, rel_b) == ("normalized", "strict")
    for c in chunks_a + chunks_b:
        write_trajectory(c, tmp_path)
    d = audit_dump(tmp_path).to_dict()
    trial_a, trial_b = d["per_trial_shares"]["a"], d["per_trial_shares"]["b"]
    assert trial_a["normalized"] > 0 and trial_a["retokenized"] > 0 and trial_a["drift_in_loss"] == 0
    assert trial_b["aligned"] == trial_b["positions"] and trial_b["normalized"] == 0
    assert 0 < d["shares"]["normalized_pct"] < 100 and d["drift_in_loss"] == 0
    assert sum(d["token_classes"][k] for k in ("aligned", "normalized", "retokenized", "split", "placeholder",
                                               "unattributed")) == d["positions"]
    cli = Path(sys.executable).with_name("t1ops")
    out = subprocess.run([str(cli), "audit", str(tmp_path), "--per-trial"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "tokens normalized" in out.stdout and "per trial" in out.stdout
