"""`t1ops audit` measures loss-region drift against the engine's own record (t1ops/audit_engine.py),
plus the TITO rules the audit reports on: the tightened normalized relation and the debug dump."""
from __future__ import annotations

import json

import numpy as np
import torch

from rl.agent import response
from rl.chat import IM_END_ID
from rl.engines.embedded_engine import EmbeddedEngine
from rl.engines.emission_log import EmissionLog, read_emissions
from rl.engines.protocol import GenerateRequest, SamplingParams
from rl.model import ModelSpec
from rl.tito import TitoBuilder
from rl.tito_relations import find_normalized_repair
from rl.vocab import CompactVocab
from t1ops.audit import audit_dump, read_trajectory, write_trajectory
from t1ops.cli import main
from t1ops.campaign.trials import TrialResult
from t1ops.tito_debug import write_debug

IM_START = 248045
VOCAB = CompactVocab(list(range(100, 140)) + [IM_START, IM_END_ID], 248_320)
SPEC = ModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, num_experts=8,
                 moe_router_topk=2, moe_ffn_hidden_size=32, max_seq_len=96, vocab_size=VOCAB.size)


def _run_dir(tmp_path):
    """Two turns of one trial sampled by a real embedded engine that logs its emissions; the dump
    written from the trajectory the loop's recorder built."""
    torch.set_num_threads(1)
    engine = EmbeddedEngine(SPEC, VOCAB, torch.bfloat16, 0, batching=False)
    engine.emission_log = EmissionLog(tmp_path / "emissions" / "engine-0.jsonl")
    builder = TitoBuilder([IM_START, 101, 102, 103], sample_id="trial-7")
    for turn in range(2):
        req = GenerateRequest(input_ids=tuple(builder.tokens), rid=f"trial-7-t{turn}", return_logprob=True,
                              sampling_params=SamplingParams(max_new_tokens=5, temperature=1.0, sampling_seed=turn))
        response.record(builder, engine.generate(req), 0)
        if builder.tokens[-1] != IM_END_ID:  # a truncated turn ends the trajectory
            break
        builder.add_observation([IM_START, 110, 111])
    for chunk in builder.finish():
        write_trajectory(chunk, tmp_path / "dumps")
    return tmp_path


def test_clean_run_reports_zero_drift_from_the_engine_record(tmp_path, capsys):
    run = _run_dir(tmp_path)
    assert set(read_emissions(run / "emissions")) >= {"trial-7-t0"}
    eng = audit_dump(run / "dumps").engine
    assert eng["record"] and eng["requests"] >= 1 and eng["loss_tokens"] > 0
    assert (eng["drift"], eng["unverified"]) == (0, 0)
    assert main(["audit", str(run / "dumps")]) == 0


def test_a_dump_altered_after_the_engine_is_caught_with_its_positions(tmp_path, capsys):
    run = _run_dir(tmp_path)
    path = next((run / "dumps").glob("*.npz"))
    t = read_trajectory(path)
    j = int(np.flatnonzero(t.loss_mask)[0])
    t.tokens[j] = t.engine_tokens[j] = 120 if t.tokens[j] != 120 else 121  # consistent: the old check saw 0
    path.unlink()
    write_trajectory(t, run / "dumps")
    rep = audit_dump(run / "dumps")
    assert rep.drift_in_loss == 0  # the dump agrees with itself ...
    assert rep.engine["drift"] == 1 and f"pos {j}:" in rep.engine["positions"][0]  # ... not with the engine
    assert main(["audit", str(run / "dumps")]) == 1
    assert f"pos {j}" in capsys.readouterr().out


def test_unrelated_prompt_is_split_not_normalized():
    stream = np.array(list(range(1000, 1035)) + [IM_END_ID])          # a 36-token stream
    prompt = np.array([2000, 2001, IM_END_ID, 2002] + list(range(3000, 3040)))  # nothing in common
    assert find_normalized_repair(stream, prompt) is None  # was (0, 35, 2): realigned on one stop token
    b = TitoBuilder(list(range(1000, 1010)), sample_id="u")
    b.add_turn(list(range(1000, 1010)), list(range(1010, 1035)) + [IM_END_ID], [-0.1] * 26, policy_version=0)
    assert b.add_turn(prompt.tolist(), [5, IM_END_ID], [-0.1, -0.1], policy_version=0) == "split"
    # a local repair (a few ids re-encoded right before the stop token) still realigns on it
    assert find_normalized_repair(np.array([1, 2, 3, 4, IM_END_ID]), np.array([1, 2, 9, IM_END_ID, 7])) == (2, 2, 1)


def test_debug_dump_writes_transitions_per_trajectory(tmp_path):
    b = TitoBuilder([1, 2, 3], sample_id="d1")
    b.add_generation([4, 5, IM_END_ID], [-0.1] * 3, policy_version=0, rid="d1-t0")
    b.add_observation([6, 7])
    b.add_generation([8, IM_END_ID], [-0.1] * 2, policy_version=0, rid="d1-t1")
    out = write_debug(tmp_path, TrialResult(task="t", group_id="d", sample_id="d1", reward=1.0, chunks=b.finish()),
                      decode=lambda ids: " ".join(map(str, ids)))
    doc = json.loads((out / "tito_transitions.json").read_text())
    assert [(t["relation"], t["loss_tokens"]) for t in doc["transitions"]] == [("strict", 3), ("strict", 2)]
    assert "[[4 5 " in (out / "tito_debug.txt").read_text()
