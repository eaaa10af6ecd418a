"""A real embedded engine whose tiny model has memorised one tool-calling conversation.

A random tiny model never emits a ``<tool_call>``; to drive a multi-turn,
tool-calling conversation through the real engine, the model is first trained
(supervised, ``rl.trainer.sft.sft_update``) on the conversation as the
endpoint renders it, until greedy decoding reproduces every assistant turn.
Nothing is scripted at generation time: the engine samples (greedy) from its
own weights, and the endpoint parses what it samples.
"""
from __future__ import annotations

import threading

import httpx
import torch

from rl.chat import ENDOFTEXT_ID, IM_END_ID, IM_START_ID, ChatRenderer
from rl.engines.client import EngineClient
from rl.engines.embedded import serve
from rl.engines.embedded_engine import EmbeddedEngine
from rl.engines.ports import free_port
from rl.chat.template import render
from rl.model import ModelSpec, build_policy, load_state, policy_forward, weights_state_dict
from rl.trainer.settings import TrainerSettings
from rl.trainer.optim import build_optimizer
from rl.trainer.sft import sft_update
from rl.vocab import CompactVocab

BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run one shell command in the workspace.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
SYSTEM = "You are a terminal agent."
USER = "Write hi into hello.txt, then show it."
COMMANDS = ("echo hi > hello.txt", "cat hello.txt")
OUTPUTS = ("", "hi")
FINAL = "Done."


def conversation() -> list[dict]:
    """The whole conversation as the harness will send it (canonical argument JSON)."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    for i, (cmd, out) in enumerate(zip(COMMANDS, OUTPUTS)):
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": "bash", "arguments": '{"command": "' + cmd + '"}'}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": out})
    msgs.append({"role": "assistant", "content": FINAL})
    return msgs


def training_sequences(renderer: ChatRenderer) -> list[tuple[list[int], list[int]]]:
    """One (tokens, loss mask) per assistant turn: the prompt the endpoint will render for it
    (history as the harness re-sends it), then the reply with its stop token."""
    msgs = conversation()
    out = []
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = renderer.encode(render(msgs[:k], [BASH_TOOL]))
        full = renderer.encode(render(msgs[:k + 1], [BASH_TOOL], add_generation_prompt=False))
        assert full[:len(prompt)] == prompt
        reply = full[len(prompt):full.index(IM_END_ID, len(prompt)) + 1]
        out.append((prompt + reply, [0] * len(prompt) + [1] * len(reply)))
    return out


def train_engine(renderer: ChatRenderer, *, max_steps: int = 400, seed: int = 0) -> tuple[EmbeddedEngine, int]:
    seqs = training_sequences(renderer)
    ids = {IM_START_ID, IM_END_ID, ENDOFTEXT_ID}.union(*(t for t, _ in seqs))
    vocab = CompactVocab(ids, 248_320, has_unk=True)
    spec = ModelSpec(vocab_size=vocab.size, max_seq_len=1024)
    torch.manual_seed(seed)
    model = build_policy(spec, seed, dtype=torch.float32, unk_id=vocab.unk_id)
    opt = build_optimizer(model, 3e-3, TrainerSettings())
    compact = [vocab.encode_inputs(t) for t, _ in seqs]
    masks = [m for _, m in seqs]
    steps = 0
    for steps in range(1, max_steps + 1):
        sft_update(model, opt, compact, masks, grad_clip=1.0)
        if steps % 5 == 0 and all(_greedy_reproduces(model, c, m, vocab.unk_id) for c, m in zip(compact, masks)):
            break
    else:
        raise AssertionError(f"the tiny model did not memorise the conversation in {max_steps} steps")
    engine = EmbeddedEngine(spec, vocab, torch.float32, seed)
    load_state(engine.model, weights_state_dict(model))
    return engine, steps


def _greedy_reproduces(model, compact: list[int], mask: list[int], unk_id: int | None) -> bool:
    """Teacher-forced argmax equals every target: greedy decoding then reproduces each turn, with a margin."""
    model.eval()
    with torch.no_grad():
        logits = policy_forward(model, torch.tensor([compact[:-1]])).float()[0]
    model.train()
    if unk_id is not None:
        logits[:, unk_id] = float("-inf")
    top2 = torch.topk(logits, 2, dim=-1).values
    target = torch.tensor(compact[1:])
    hit = logits.argmax(-1) == target
    margin = top2[:, 0] - top2[:, 1]
    loss_pos = torch.tensor(mask[1:], dtype=torch.bool)
    return bool(hit[loss_pos].all() and (margin[loss_pos] > 1.0).all())


def serve_engine(engine: EmbeddedEngine) -> EngineClient:
    port = free_port()
    threading.Thread(target=serve, args=(engine, "127.0.0.1", port), daemon=True).start()
    http = httpx.Client(timeout=120.0)
    client = EngineClient(f"http://127.0.0.1:{port}", http, num_moe_layers=engine.spec.num_layers,
                          topk=engine.spec.moe_router_topk, num_experts=engine.spec.num_experts)
    for _ in range(200):
        try:
            if client.health():
                return client
        except httpx.TransportError:
            pass
        threading.Event().wait(0.05)
    raise RuntimeError("embedded engine did not come up")
