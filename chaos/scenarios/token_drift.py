"""token-drift: a harness that re-renders parsed history trains on ids the engine never sampled.

Fault (real): a text-persisting harness. Each turn it stores the assistant
message as *parsed* text (``rl.chat.parse_assistant``: whitespace stripped,
JSON arguments re-serialised) and re-renders the whole history through the
chat template, so every earlier turn comes back as encode-of-decode. The
sampled turns are real Qwen3.5 ids where that round trip is not the identity:
compact JSON, a non-canonical BPE split ("hel"+"lo"), ``<|im_end|>`` spelled
in six ordinary ids, a decomposed (NFD) accent, trailing whitespace. The fault
is observed, not assumed: the re-rendered ids differ from the sampled ids.

Unguarded: the naive pipeline trains on the harness's final transcript; the
loss region holds ids the engine never sampled (``t1ops audit`` drift > 0).
Guarded: ``rl.tito.TitoBuilder`` in harness mode relates each prompt to its
stream (strict / normalized / retokenized / split); the loss region keeps the
sampled ids; the audit reports the retokenized share and 0% drift.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from chaos.harness import Guarded, Outcome, register
from rl.chat import IM_END_ID, ChatRenderer, parse_assistant, render_text
from rl.tito import Trajectory, TitoBuilder
from t1ops.audit import audit_dump, write_trajectory

HISTORY = [{"role": "system", "content": "You are a terminal agent."},
           {"role": "user", "content": "Make the failing test pass."}]
TOOL_OUTPUTS = ["a.py  b.py  test_a.py", "1 failed", "ok", "menu updated", ""]


def _call(cmd: str) -> str:
    return '\n<tool_call>\n{"name":"bash","arguments":{"cmd":"' + cmd + '"}}\n</tool_call>'


def sampled_turns(r: ChatRenderer) -> list[list[int]]:
    """Real ids a policy can emit where encode(decode(ids)) != ids or parsing normalises."""
    tok, enc = r.tokenizer, r.encode
    pieces = tok.encode("<|im_end|>", allowed_special=set())       # 6 ordinary ids
    nfd = tok._tokenizer.encode_ordinary("e\u0301")                # decomposed accent
    return [
        enc("Listing files." + _call("ls")) + [IM_END_ID],               # compact JSON
        enc("Checking ") + enc("hel") + enc("lo") + enc(".py" + _call("pytest -x")) + [IM_END_ID],
        enc("The marker ") + pieces + enc(" ends a turn." + _call("cat a.py")) + [IM_END_ID],
        enc("caf") + nfd + enc(" menu fixed." + _call("sed -i s/x/y/ a.py")) + [IM_END_ID],
        enc("All tests pass.  \n") + [IM_END_ID],                         # trailing whitespace
    ]


def _logprobs(ids: list[int]) -> list[float]:
    return [-0.05] * len(ids)


def _harness_prompts(r: ChatRenderer, gens: list[list[int]]) -> tuple[list[list[int]], list]:
    """What the text-persisting harness feeds the engine each turn, and its final history."""
    history, prompts = list(HISTORY), []
    for gen, out in zip(gens, TOOL_OUTPUTS):
        prompts.append(r.render_prompt(history))
        history += [parse_assistant(r.decode(gen)), {"role": "tool", "content": out}]
    return prompts, history


def _naive_trajectory(r: ChatRenderer, history: list, gens: list[list[int]]) -> Trajectory:
    """Train on the harness transcript: loss = the re-rendered assistant spans."""
    tokens, mask, engine = [], [], []
    asst = iter(gens)
    for m in history[:2 * len(gens) + 1]:  # up to the last assistant turn
        ids = r.encode(render_text([m]))  # one tool message per turn: renders alone
        if m["role"] == "assistant":
            head, sampled = 3, next(asst)        # "<|im_start|>assistant\n" is 3 ids
            span = ids[head:-1]                  # through <|im_end|>, not the "\n" after it
            eng = [sampled[k] if k < len(sampled) else -1 for k in range(len(span))]
            tokens += ids[:head] + span + ids[-1:]
            mask += [0] * head + [1] * len(span) + [0]
            engine += ids[:head] + eng + ids[-1:]
        else:
            tokens += ids
            mask += [0] * len(ids)
            engine += ids
    n = len(tokens)
    mask_arr = np.asarray(mask, dtype=np.int8)
    return Trajectory(tokens=np.asarray(tokens), loss_mask=mask_arr,
                      rollout_logprobs=np.where(mask_arr == 1, -0.05, 0).astype(np.float32),
                      engine_tokens=np.asarray(engine), origin=np.zeros(n, np.int8),
                      policy_version=np.where(mask_arr == 1, 0, -1).astype(np.int32), routing=None,
                      meta={"sample_id": "naive", "chunk_id": 0, "relations": []})  # no prefix test: it re-renders


@register("token-drift", "a harness re-renders parsed history; encode-of-decode is not the identity")
def run(tmp: Path) -> Outcome:
    r = ChatRenderer.default()
    gens = sampled_turns(r)
    prompts, history = _harness_prompts(r, gens)
    # the fault, observed: re-rendering a parsed turn does not give back the sampled ids
    rerendered = [r.encode(render_text([parse_assistant(r.decode(g))]))[3:-1] for g in gens]
    changed = [t for t, (g, rr) in enumerate(zip(gens, rerendered)) if g != rr]
    roundtrip = [t for t, g in enumerate(gens) if r.encode(r.decode(g)) != g]

    write_trajectory(_naive_trajectory(r, history, gens), tmp / "unguarded")
    naive = audit_dump(tmp / "unguarded").to_dict()
    unguarded = (f"naive re-render: at {naive['drift_in_loss']} of {naive['loss_positions']} loss-bearing "
                 f"positions ({naive['drift_in_loss_pct']:.2f}%) the id is not what the engine sampled there; "
                 f"t1ops audit drift inside loss region {naive['drift_in_loss_pct']:.2f}% (exit 1)")

    t0, first_detect = time.monotonic(), None
    b = TitoBuilder(prompts[0], sample_id="tito", tokenizer=r.tokenizer)
    relations = []
    for prompt, gen in zip(prompts, gens):
        relations.append(b.add_turn(prompt, gen, _logprobs(gen), policy_version=0))
        if relations[-1] != "strict" and first_detect is None:
            first_detect = time.monotonic() - t0
    chunks = b.finish()
    for c in chunks:
        write_trajectory(c, tmp / "guarded")
    rep = audit_dump(tmp / "guarded").to_dict()
    loss_ids = np.concatenate([c.tokens[c.loss_mask == 1] for c in chunks]).tolist()
    non_strict = [rel for rel in relations if rel != "strict"]
    caught = bool(non_strict) and rep["drift_in_loss"] == 0
    error = (f"TITO: {len(non_strict)} of {len(relations)} turns not strict ({', '.join(relations)}); "
             f"t1ops audit: aligned {rep['aligned_pct']:.2f}%, retokenized {rep['retokenized_pct']:.2f}%, "
             f"placeholder {rep['placeholder_pct']:.2f}%, drift inside loss region "
             f"{rep['drift_in_loss_pct']:.4f}%")
    return Outcome(
        fault_fired=bool(changed),
        unguarded=unguarded,
        guarded=Guarded(caught=caught, detection_s=first_detect, error=error),
        invariants={
            "loss_region_drift_zero": rep["drift_in_loss"] == 0,
            "sampled_ids_bit_identical": loss_ids == [t for g in gens for t in g],
            "unguarded_drift_inside_loss_region_seen_by_audit": naive["drift_in_loss"] > 0,
            "one_group_id": len({c.meta["group_id"] for c in chunks}) == 1,
        },
        details={"turns_rerendered_differently": changed, "turns_encode_decode_not_identity": roundtrip,
                 "relations": relations, "repairs": [c.meta["repairs"] for c in chunks],
                 "guarded_audit": rep, "unguarded_audit": naive})
