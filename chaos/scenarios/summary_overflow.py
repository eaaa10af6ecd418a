"""summary-overflow: the summary request exceeds the context window; summaries fail, history is lost.

The report (section 09): "The summarization call reserved 4,000 free tokens but
requested max_new_tokens 8,192; at the observed median prompt of 78,541
tokens, 78,541 + 8,192 = 86,733 > 86,016, so 98.3% of 1,321 full-summary
attempts failed". Reproduced at 1/336 scale (context 256, summary request 24,
separate reserve 12) through the production agent loop's own compaction
(``rl.agent.compaction``, docs/compaction.md):

- a real embedded engine (``rl.engines.embedded_spawn.spawn``, context window 256)
  serves every turn and every summary, and refuses (HTTP 400) any request whose
  prompt + max_new_tokens exceeds its window, as SGLang does;
- the real ``run_episode`` with a real execute: each trial is a real
  ``rl.agent.sandbox`` trial of a bundled task (a trial starts in well under a
  second), and the command runs jailed in it;
- the policy is the scenario's warm start of the tiny model (about 70
  supervised steps, seconds on a CPU, like the campaign's warm start): it calls
  ``bash`` with ``seq 1 3`` on every turn, so each turn adds its reply and the
  output and the histories grow past the threshold; greedy sampling keeps it
  repeatable.

Unguarded: the report's bug injected by replacing the loop's two budget seams,
``rl.agent.budget.compaction_threshold`` (a reserve of its own, ``context -
12``, not derived from the request) and ``fit_generation`` for the summary call
(no fit check). The loop compacts late, the engine refuses the summary
requests, and each trial ends with its history lost (``summary_failed``).
Guarded: the production code as is: the trigger is derived from the request,
every summary is served, and the trials continue from the summary in a new
trajectory chunk. Runbook: ``runbooks/summary-overflow.md``.
"""
from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from rl.agent import budget
from rl.errors import EngineError

SCALE = 86_016 / 256
CONTEXT = 256                # 86,016 / 336
SUMMARY_MAX_NEW = 24         # 8,192 / 336
NAIVE_RESERVE = 12           # 4,000 / 336: configured separately from the request (the bug)
TURN_MAX_NEW = 24            # one tool call of the warm-started policy
MAX_TURNS = 8
COMMAND = "seq 1 3"
TASKS = ("files-rename", "shell-chmod", "json-empty", "files-mkdir", "math-max")  # short prompts (53-57 tokens)
REPO = Path(__file__).resolve().parents[2]


def _warm_start(tasks, renderer, vocab, spec, steps: int = 120) -> dict:
    """Supervised steps until the tiny policy calls bash with COMMAND after every assistant prompt
    (first contexts, after outputs, after a summary); returns its weights."""
    import numpy as np
    import torch

    from rl.agent.compaction import fresh_messages
    from rl.agent.loop import initial_messages, observation_text, tool_call_text
    from rl.chat import IM_END_ID
    from rl.model import build_policy, weights_state_dict
    from rl.trainer.sft import sft_update

    rng = random.Random(0)
    call = renderer.encode(tool_call_text(COMMAND)) + [IM_END_ID]
    output = observation_text("1\n2\n3", "", 0, "ok")
    obs = renderer.observation_ids([{"role": "tool", "content": output}], IM_END_ID)

    def example(task):
        base = initial_messages(task.instruction)
        if rng.random() < 0.4:  # a context after a summary (the summary is some prefix of a reply)
            base = fresh_messages(base, renderer.decode(call[:rng.randint(1, len(call))]), output)
        tokens = renderer.render_prompt(base)
        mask = [0] * len(tokens)
        while len(tokens) + len(call) + len(obs) <= CONTEXT:
            tokens, mask = tokens + call + obs, mask + [1] * len(call) + [0] * len(obs)
        return np.asarray(vocab.encode_inputs(tokens)), np.asarray(mask)

    torch.manual_seed(0)
    actor = build_policy(spec, 0, torch.float32, unk_id=vocab.unk_id)
    opt = torch.optim.Adam(actor.parameters(), lr=3e-3)
    for _ in range(steps):
        batch = [example(rng.choice(tasks)) for _ in range(8)]
        if sft_update(actor, opt, [t for t, _ in batch], [m for _, m in batch], 1.0).loss < 0.005:
            break
    return weights_state_dict(actor)


class _Recorder:
    """Wraps the engine client (observation only): each request's size and whether it was served."""

    def __init__(self, client) -> None:
        self.client, self.calls = client, []

    def generate(self, req):
        row = {"rid": req.rid, "prompt": len(req.input_ids), "max_new": req.sampling_params.max_new_tokens,
               "summary": "-summary" in req.rid, "sent_at": time.monotonic()}
        self.calls.append(row)
        try:
            resp = self.client.generate(req)
        except EngineError as err:
            row["refused"] = str(err)[:200]
            raise
        row["served_at"] = time.monotonic()
        return resp


@contextlib.contextmanager
def _naive_budget():
    """The report's bug through the loop's seams: a reserve of its own, and the summary call unchecked."""
    threshold, fit = budget.compaction_threshold, budget.fit_generation

    def naive_threshold(context_window: int, _reserve_from_requests: int) -> int:
        return context_window - NAIVE_RESERVE

    def unchecked(prompt_tokens, max_new_tokens, context_window, min_new_tokens=1, *, where="generation"):
        if "summary" in where:  # agent turns keep their fit check, as in the report's harness
            return budget.Budget(prompt_tokens, max_new_tokens, context_window, clamped=False)
        return fit(prompt_tokens, max_new_tokens, context_window, min_new_tokens, where=where)

    budget.compaction_threshold, budget.fit_generation = naive_threshold, unchecked
    try:
        yield
    finally:
        budget.compaction_threshold, budget.fit_generation = threshold, fit


def _episodes(tmp: Path, name: str, tasks, engine: _Recorder, renderer, spec) -> list:
    from rl.agent.loop import AgentSettings, run_episode
    from rl.agent.sandbox import Sandbox

    settings = AgentSettings(max_turns=MAX_TURNS, max_new_tokens=TURN_MAX_NEW, context_window=CONTEXT,
                             temperature=0.0, min_new_tokens=TURN_MAX_NEW, summary_max_new_tokens=SUMMARY_MAX_NEW,
                             num_layers=spec.num_layers, topk=spec.moe_router_topk)
    sandbox, episodes = Sandbox(tmp / "trials", name), []
    for i, task in enumerate(tasks):
        trial = sandbox.create(task, i)
        try:
            episodes.append(run_episode(task.instruction, trial.exec, engine.generate, renderer, settings,
                                        sample_id=f"{name}-{task.name}", group_id=f"{name}-{task.name}",
                                        prompt_id=task.name))
        finally:
            trial.close()
    return episodes


def _start(tmp: Path):
    """Warm-start the tiny policy and serve it from a real embedded engine with a 256-token window."""
    from rl.agent.loop import tool_call_text
    from rl.agent.tasks import load_pool, load_task
    from rl.chat import ChatRenderer
    from rl.engines.embedded_spawn import spawn
    from rl.engines.ports import free_port
    from rl.model import ModelSpec
    from t1ops.campaign.launch import build_vocab
    from t1ops.guards.checkpoints import save_checkpoint

    renderer = ChatRenderer.default()
    tasks = [load_task(REPO / "examples" / "tasks" / t) for t in TASKS]
    vocab = build_vocab(load_pool(REPO / "examples" / "tasks"), renderer, 248_320)  # as the campaign builds it
    call = renderer.encode(tool_call_text(COMMAND))
    if vocab.unk_id in vocab.encode_inputs(call):
        raise RuntimeError(f"the compact vocabulary cannot spell the policy's call {COMMAND!r}")
    vocab.save(tmp / "vocab.json")
    spec = ModelSpec(max_seq_len=CONTEXT, vocab_size=vocab.size)
    ckpt = save_checkpoint(tmp / "actor", "actor", 0, _warm_start(tasks, renderer, vocab, spec))
    proc = spawn(free_port(), spec, checkpoint=ckpt, vocab_path=tmp / "vocab.json", log_path=tmp / "engine.log")
    return proc, tasks, renderer, spec


@register("summary-overflow", "prompt + max_new_tokens exceeds the context window; summaries fail")
def run(tmp: Path) -> Outcome:
    import httpx

    from rl.engines.client import EngineClient

    started = time.monotonic()
    proc, tasks, renderer, spec = _start(tmp)
    ready = time.monotonic()
    try:
        with httpx.Client(timeout=120) as http:
            kw = dict(num_moe_layers=spec.num_layers, topk=spec.moe_router_topk, num_experts=spec.num_experts)
            client = EngineClient(proc.url, http, **kw)
            naive = _Recorder(client)
            with _naive_budget():
                unguarded = _episodes(tmp, "unguarded", tasks, naive, renderer, spec)
            guard = _Recorder(client)
            t0 = time.monotonic()
            guarded = _episodes(tmp, "guarded", tasks, guard, renderer, spec)
    finally:
        proc.kill()
        proc.wait()
    out = _outcome(naive.calls, guard.calls, unguarded, guarded, t0)
    out.details.update(setup_s=round(ready - started, 1), episodes_s=round(time.monotonic() - ready, 1),
                       commands_run=sum(len(ep.commands) for ep in unguarded + guarded))
    return out


def _outcome(naive_calls, guard_calls, unguarded, guarded, t0) -> Outcome:
    tried = [c for c in naive_calls if c["summary"]]
    refused = [c for c in tried if "refused" in c]
    served = [c for c in guard_calls if c["summary"] and "served_at" in c]
    share = len(refused) / max(1, len(tried))
    fits = all(c["prompt"] + c["max_new"] <= CONTEXT for c in guard_calls)
    continued = [ep for ep in guarded if ep.compactions and len(ep.chunks) > 1 and _turns_after_compaction(ep)]
    first = min((c["served_at"] for c in served), default=None)
    tl = Timeline()  # the first guarded summary: the history reached the compaction point, compacted, served
    if served:
        one = min(served, key=lambda c: c["sent_at"])
        tl.fault(at=one["sent_at"])
        tl.detected(at=one["sent_at"])  # the budget check chose to compact before the window was passed
        tl.healthy(at=one["served_at"])
    return Outcome(
        fault_fired=bool(refused) and all(c["prompt"] + c["max_new"] > CONTEXT for c in refused),
        unguarded=(f"{len(refused)}/{len(tried)} summaries ({share:.0%}) refused by the engine (report: 98.3% "
                   f"of 1,321); end reasons {sorted(ep.end_reason for ep in unguarded)}; e.g. "
                   f"{refused[0]['refused'][:140] if refused else '-'}"),
        guarded=Guarded(caught=bool(served) and fits and all(ep.summary_failures == 0 for ep in guarded),
                        detection_s=None if first is None else round(first - t0, 4),
                        error=(f"compaction before the history passes {CONTEXT} - (turn {TURN_MAX_NEW} + instruction "
                               f"+ summary {SUMMARY_MAX_NEW}), not {CONTEXT} - reserve {NAIVE_RESERVE}; "
                               f"{len(served)} summaries served, {sum(ep.compactions for ep in guarded)} compactions")),
        invariants={
            "unguarded_summaries_mostly_refused": share > 0.5,
            "unguarded_history_lost": all(ep.compactions == 0 and len(ep.chunks) == 1 for ep in unguarded)
            and any(ep.end_reason == "summary_failed" for ep in unguarded),
            "every_request_fits": fits,
            "every_summary_served": len(served) == sum(c["summary"] for c in guard_calls) > 0,
            "episodes_continue_after_compaction": len(continued) == len(guarded),
        },
        details={"scale": round(SCALE, 1), "summary_prompts_unguarded": [c["prompt"] for c in tried],
                 "summary_prompts_guarded": [c["prompt"] for c in guard_calls if c["summary"]],
                 "end_reasons_guarded": sorted(ep.end_reason for ep in guarded),
                 "chunks_guarded": [len(ep.chunks) for ep in guarded]},
        recovery=tl.recovery(how="in place: compaction before the window; the summary served, the trial goes on"))


def _turns_after_compaction(ep) -> bool:
    """A later chunk holds a sampled agent turn: the trial went on from its summary."""
    return any(int(c.loss_mask.sum()) > 0 for c in ep.chunks[1:])
