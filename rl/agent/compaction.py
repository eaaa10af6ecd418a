"""History compaction for the agent loop: summarise, then continue from a fresh context.

The report (section 09; docs/failures.md, ``summary-overflow``): the summary
call reserved 4,000 free tokens but asked for ``max_new_tokens`` 8,192, so at
the median prompt of 78,541 tokens 98.3% of the summaries were refused and the
agents lost their history. Here the trigger is derived from the summary
request itself and the request goes through ``fit_generation``, so a summary
can never exceed the context window (docs/compaction.md).

When (checked after each turn's observation is known, before it is appended):
the summary prompt is the history ``H`` (ending with the assistant's stop
token) plus a fixed user turn with :data:`SUMMARY_INSTRUCTION`, and it asks for
``summary_max_new_tokens``. Waiting one more turn grows ``H`` to at most ``next
prompt + max_new_tokens``, so the loop compacts now when the next prompt is
longer than ``compaction_threshold(context, max_new_tokens + instruction tokens
+ summary_max_new_tokens)``: the reserve is the sum of the requests, never a
number of its own. The last command's output is not part of the summary
prompt (its size is not bounded by the rule); it is carried verbatim into the
fresh context instead.

How: the summary is a real engine request through the same ``generate``
(trainable like any turn: log-probs, routing, policy version); then the TITO
stream starts a new chunk (``TitoBuilder.start_chunk``) from system + task +
summary + the last output. A summary that cannot fit (``BudgetError``, never
sent) or that the engine refuses (HTTP 400) is counted in
``Episode.summary_failures`` and ends the episode with ``summary_failed``:
nothing continues on a lost history.

The loop calls ``budget.compaction_threshold`` and ``budget.fit_generation``
through the module, so the chaos scenario replaces exactly those two seams.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from rl.agent import budget, response
from rl.chat import STOP_IDS, ChatRenderer
from rl.errors import BudgetError, EngineError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "summary-overflow": ("rollout.summary_max_new_tokens", "rollout.max_new_tokens", "rollout.context_window"),
}

log = logging.getLogger("rl.agent.compaction")

SUMMARY_INSTRUCTION = "Context full: summarize your progress so you can continue from it alone. No tool call."
SUMMARY_HEADER = "Summary of your work so far (your earlier context was compacted):"
LAST_OUTPUT_HEADER = "Output of your last command:"


def fresh_messages(base: list[dict], summary: str, last_output: str) -> list[dict]:
    """The new context: ``base`` (system + task) with the summary and the last output appended
    to the task's user turn."""
    *head, task = base
    content = f"{task['content']}\n\n{SUMMARY_HEADER}\n{summary.strip()}\n\n{LAST_OUTPUT_HEADER}\n{last_output}"
    return [*head, {**task, "content": content}]


@dataclass
class Compactor:
    """One episode's compaction: decides when, sends the summary, starts the new chunk."""

    base_messages: list[dict]                       # system + task (initial_messages)
    encode_prompt: Callable[[list[dict]], list[int]]  # messages -> prompt ids (tools section included)
    renderer: ChatRenderer
    settings: Any                                   # AgentSettings
    sample_id: str
    _instruction: dict[int, list[int]] = field(default_factory=dict)

    def instruction_ids(self, last_id: int) -> list[int]:
        """The summarise instruction as a user turn after a turn that ended with ``last_id``."""
        if last_id not in self._instruction:
            msg = [{"role": "user", "content": SUMMARY_INSTRUCTION}]
            self._instruction[last_id] = self.renderer.observation_ids(msg, last_id, sample=self.sample_id)
        return self._instruction[last_id]

    def threshold(self, last_id: int) -> int:
        """The longest next prompt after which the loop may wait one more turn: room stays for
        that turn's reply, the instruction and the whole summary request."""
        s = self.settings
        reserve = s.max_new_tokens + len(self.instruction_ids(last_id)) + s.summary_max_new_tokens
        return budget.compaction_threshold(s.context_window, reserve)

    def due(self, history_len: int, observation_len: int, last_id: int) -> bool:
        """Compact now: after one more turn the summary request might no longer fit (also when no
        history could leave room for a turn and the summary: the fit check then says so)."""
        try:
            return history_len + observation_len > self.threshold(last_id)
        except BudgetError:
            return True

    def compact(self, turn: int, builder, ep, generate, routed_upto: int, last_id: int,
                last_output: str, clock: Callable[[], float]) -> tuple[int, bool]:
        """Summarise the history and start a new chunk; returns (routed_upto, episode ends)."""
        s, instr = self.settings, self.instruction_ids(last_id)
        prompt = builder.tokens + instr
        where = f"{self.sample_id} summary after turn {turn}"
        try:
            fit = budget.fit_generation(len(prompt), s.summary_max_new_tokens, s.context_window,
                                        min_new_tokens=s.summary_max_new_tokens, where=where)
        except BudgetError as err:
            return self._failed(ep, routed_upto, f"not sent: {err}")
        builder.add_observation(instr)
        req = fit.request(prompt, f"{self.sample_id}-summary{turn}", temperature=s.temperature,
                          routed_upto=routed_upto, routing=s.num_layers is not None)
        t0 = clock()
        try:
            resp = generate(req)
        except EngineError as err:
            if err.context.get("status_code") != 400:
                raise  # a dead or unreachable engine is the pool's business, not a failed summary
            return self._failed(ep, routed_upto, f"refused by the engine: {err}")
        finally:
            ep.generate_s += clock() - t0
        response.record(builder, resp, routed_upto)
        ids = [int(t) for t in resp.output_ids]
        summary = self.renderer.decode(ids[:-1] if ids and ids[-1] in STOP_IDS else ids)
        builder.start_chunk(self.encode_prompt(fresh_messages(self.base_messages, summary, last_output)))
        ep.compactions += 1
        log.info("%s: history of %d tokens compacted into a %d-token summary", where, len(prompt), len(ids))
        return 0, False

    def _failed(self, ep, routed_upto: int, why: str) -> tuple[int, bool]:
        ep.summary_failures += 1
        ep.end_reason = "summary_failed"
        log.warning("%s: summary failed (%s); the episode ends", self.sample_id, why)
        return routed_upto, True
