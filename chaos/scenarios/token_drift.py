"""token-drift: a harness that persists chat text trains on ids the engine never sampled.

Fault (real, nothing hand-picked): ``t1ops engine serve --openai`` (the
production endpoint: ``rl.harness.standalone``, one ``HarnessSession`` per
trial, each rendered prompt related to the token stream by
``TitoBuilder.add_turn``) in front of a real embedded engine. Its vocabulary
is the campaign's own (``t1ops.campaign.launch.build_vocab`` over
``examples/tasks``, the default ``engine.compact_vocab = true``), so the
random tiny model samples real Qwen3.5 ids of the pool, the stop ids among
them (some turns stop, some hit ``max_tokens``). A chat harness on the
official ``openai`` client keeps history the way most harnesses do: each
reply's ``message.content`` (parsed text) is appended and the whole history
is sent again, so the endpoint re-renders every earlier turn through the Qwen3
template with the real tokenizer. Sampled ids of a random model do not round
trip: BPE merges pieces the model sampled apart, ``<|im_start|>`` sampled as a
special id comes back through text, the parser strips whitespace. The fault is
observed per turn: the re-rendered ids of each assistant turn are compared
with the ids the engine sampled for it (the endpoint's recorded stream).

Unguarded: the naive pipeline trains on the harness's final transcript
(encode of the rendered messages, loss on the assistant spans); the
production audit (``t1ops.audit.audit_dump``) finds ids the engine never
sampled inside the loss region (drift > 0).
Guarded: the endpoint's recorded trajectory (``--dump``): 0% drift, with the
relations each turn needed (strict / normalized / retokenized / split) and the
audit's retokenized and split shares; its loss-region tokens are byte for
byte the tokens the endpoint returned to the harness (``logprobs``).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from chaos.harness import Guarded, Outcome, Timeline, register
from t1ops.audit import audit_dump, read_trajectory, write_trajectory

REPO = Path(__file__).resolve().parents[2]
TURNS = 6
MAX_TOKENS = 96
SYSTEM = "You are a terminal agent."
USER = "Make the failing test pass."
FOLLOW_UP = "Go on."
START_TIMEOUT_S = 300.0  # a loaded 2-core machine imports torch and megatron slowly
SPEC = dict(num_layers=1, hidden_size=32, num_attention_heads=2, ffn_hidden_size=32, num_experts=4,
            moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=1024)


def _start_endpoint(tmp: Path) -> tuple[subprocess.Popen, str, Path]:
    """``t1ops engine serve --openai`` over the campaign's vocabulary; returns (process, url, dump dir)."""
    import httpx

    from rl.agent.tasks import load_pool
    from rl.chat import ChatRenderer
    from rl.engines.ports import free_port
    from t1ops.campaign.launch import build_vocab

    vocab = build_vocab(load_pool(REPO / "examples" / "tasks"), ChatRenderer.default(), 248_320)
    vocab.save(tmp / "vocab.json")
    port, dump, log = free_port(), tmp / "endpoint-dump", tmp / "endpoint.log"
    cmd = [sys.executable, "-m", "t1ops.cli", "engine", "serve", "--openai", "--port", str(port), "--dtype", "fp32",
           "--spec-json", json.dumps({**SPEC, "vocab_size": vocab.size}), "--vocab", str(tmp / "vocab.json"),
           "--dump", str(dump), "--max-new-tokens", str(MAX_TOKENS), "--seed", "0"]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"t1ops engine serve --openai did not come up (rc {proc.poll()}): "
                               f"{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200:
                return proc, f"http://127.0.0.1:{port}/s/harness/v1", dump
        except httpx.HTTPError:
            time.sleep(0.2)


def chat_harness(base_url: str, dump: Path) -> dict:
    """The text-persisting harness: history is the replies' parsed ``content``, re-sent every turn.

    After each reply it reads the endpoint's dump (rewritten before the reply is sent) for the
    relation the turn needed: the first non-strict one is the guard's detection."""
    import openai

    api = openai.OpenAI(base_url=base_url, api_key="token-drift", max_retries=0, timeout=600)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    returned, finishes, t0, detection_s = [], [], time.monotonic(), None
    for turn in range(TURNS):
        if turn:
            messages.append({"role": "user", "content": FOLLOW_UP})
        t_req = time.monotonic()
        try:
            reply = api.chat.completions.create(model="t1ops", messages=messages, max_tokens=MAX_TOKENS,
                                                seed=turn, logprobs=True)
        except openai.APIStatusError as err:  # what the example harness does: the episode ends
            finishes.append(f"error {err.status_code}")
            break
        choice = reply.choices[0]
        messages.append({"role": "assistant", "content": choice.message.content or ""})
        returned.append([(bytes(t.bytes), float(t.logprob)) for t in choice.logprobs.content])
        finishes.append(choice.finish_reason)
        if detection_s is None and any(r != "strict" for r in _relations(dump)):
            detection_s = time.monotonic() - t_req
    return {"messages": messages, "returned": returned, "finishes": finishes, "detection_s": detection_s,
            "elapsed_s": time.monotonic() - t0}


def _chunks(dump: Path) -> list:
    return sorted((read_trajectory(p) for p in dump.glob("*.npz")), key=lambda c: c.meta["chunk_id"])


def _relations(dump: Path) -> list[str]:
    return [rel for c in _chunks(dump) for _, _, rel in c.meta.get("turn_spans", [])]


def sampled_turns(chunks: list) -> list[tuple[list[int], list[float]]]:
    """Per model call, the ids (and log-probs) the engine sampled: the recorded loss positions."""
    out = []
    for c in chunks:
        for start, end, _ in c.meta["turn_spans"]:
            keep = c.loss_mask[start:end] == 1
            out.append((c.tokens[start:end][keep].tolist(), c.rollout_logprobs[start:end][keep].tolist()))
    return out


def assistant_spans(r, messages: list[dict]) -> tuple[list[int], list[tuple[int, int]]]:
    """The final transcript's ids and each assistant turn's [start, end) in them (through <|im_end|>)."""
    from rl.chat import IM_END_ID
    from rl.chat.template import render

    ids = r.encode(render(messages, add_generation_prompt=False))
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = r.encode(render(messages[:k], add_generation_prompt=True))
        if ids[:len(head)] != head:
            raise RuntimeError(f"the transcript does not extend its own prompt at message {k}: cannot find the "
                               "assistant span")
        spans.append((len(head), ids.index(IM_END_ID, len(head)) + 1))
    return ids, spans


def naive_trajectory(ids: list[int], spans: list, sampled: list) -> tuple[object, list[list[int]]]:
    """Train on the transcript: loss on the re-rendered assistant spans; ``engine_tokens`` holds
    what the engine sampled at each of those positions (-1 past the end of its reply)."""
    from rl.tito import Trajectory

    n = len(ids)
    mask, engine = np.zeros(n, np.int8), np.asarray(ids, np.int64).copy()
    lps = np.zeros(n, np.float32)
    rerendered = []
    for (start, end), (s_ids, s_lps) in zip(spans, sampled):
        mask[start:end] = 1
        rerendered.append(ids[start:end])
        for j in range(end - start):
            engine[start + j] = s_ids[j] if j < len(s_ids) else -1
            lps[start + j] = s_lps[j] if j < len(s_lps) else 0.0
    traj = Trajectory(tokens=np.asarray(ids, np.int64), loss_mask=mask, rollout_logprobs=lps, engine_tokens=engine,
                      origin=np.zeros(n, np.int8), policy_version=np.where(mask == 1, 0, -1).astype(np.int32),
                      routing=None, meta={"sample_id": "naive", "chunk_id": 0, "relations": []})
    return traj, rerendered


@register("token-drift", "a text-persisting harness re-renders history; the transcript holds ids never sampled")
def run(tmp: Path) -> Outcome:
    from rl.chat import ChatRenderer, token_bytes

    r = ChatRenderer.default()
    proc, url, dump = _start_endpoint(tmp)
    try:
        h = chat_harness(url, dump)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    chunks = _chunks(dump)
    sampled = sampled_turns(chunks)
    relations = _relations(dump)
    ids, spans = assistant_spans(r, h["messages"])
    naive, rerendered = naive_trajectory(ids, spans, sampled)
    write_trajectory(naive, tmp / "unguarded")
    bad = audit_dump(tmp / "unguarded").to_dict()
    rep = audit_dump(dump).to_dict()
    # the fault, observed: each turn as re-rendered vs as sampled
    changed = [t for t, (rr, (s, _)) in enumerate(zip(rerendered, sampled)) if rr != s]
    no_roundtrip = [t for t, (s, _) in enumerate(sampled) if r.encode(r.decode(s)) != s]
    # guarded side, cross-checked against what the endpoint told the harness
    loss_bytes = [(token_bytes(r.tokenizer, int(t)), float(lp)) for c in chunks
                  for t, lp in zip(c.tokens[c.loss_mask == 1], c.rollout_logprobs[c.loss_mask == 1])]
    returned = [x for turn in h["returned"] for x in turn]
    same_as_returned = len(loss_bytes) == len(returned) and all(
        a[0] == b[0] and abs(a[1] - b[1]) < 1e-4 for a, b in zip(loss_bytes, returned))
    non_strict = [x for x in relations if x != "strict"]
    caught = bool(non_strict) and rep["drift_in_loss"] == 0 and rep["loss_positions"] > 0
    tl = Timeline()  # from the request that carried a re-rendered history: its turn recorded non-strict, ids kept
    tl.fault(at=0.0)
    tl.after_fault(detected=h["detection_s"], healthy=h["detection_s"] if rep["drift_in_loss"] == 0 else None)
    sh = rep["shares"]
    error = (f"endpoint (TitoBuilder.add_turn): {len(non_strict)} of {len(relations)} turns not strict "
             f"({', '.join(relations)}); t1ops audit of its dump: aligned {sh['aligned_pct']:.2f}%, normalized "
             f"{sh['normalized_pct']:.2f}%, retokenized {sh['retokenized_pct']:.2f}%, split {sh['split_pct']:.2f}%, "
             f"drift inside loss region {rep['drift_in_loss_pct']:.4f}%")
    unguarded = (f"naive re-render of {len(sampled)} real turns ({len(changed)} re-rendered differently): at "
                 f"{bad['drift_in_loss']} of {bad['loss_positions']} loss-bearing positions "
                 f"({bad['drift_in_loss_pct']:.2f}%) the id is not what the engine sampled; t1ops audit drift "
                 f"inside loss region {bad['drift_in_loss_pct']:.2f}% (exit 1)")
    return Outcome(
        fault_fired=bool(changed),
        unguarded=unguarded,
        guarded=Guarded(caught=caught, detection_s=h["detection_s"], error=error),
        invariants={
            "several_real_turns": len(sampled) >= 3 and len(sampled) == len(spans),
            "unguarded_rerender_differs_from_sampled": bool(changed),
            "unguarded_drift_inside_loss_region_seen_by_audit": bad["drift_in_loss"] > 0,
            "loss_region_drift_zero": rep["drift_in_loss"] == 0,
            "loss_region_is_what_the_endpoint_returned": same_as_returned,
            "one_group_id": len({c.meta["group_id"] for c in chunks}) == 1,
        },
        details={"turns_rerendered_differently": changed, "turns_encode_decode_not_identity": no_roundtrip,
                 "finish_reasons": h["finishes"], "relations": relations,
                 "sampled_vs_rerendered": [{"sampled": s, "rerendered": rr} for (s, _), rr in zip(sampled, rerendered)],
                 "repairs": [c.meta.get("repairs") for c in chunks], "guarded_audit": rep, "unguarded_audit": bad,
                 "vocabulary": "campaign build_vocab(examples/tasks), engine.compact_vocab = true"},
        recovery=tl.recovery(how="in place: the endpoint keeps the sampled ids (the relation recorded), the "
                                 "same turn trains on them"))
