"""Context budget: ``prompt + max_new_tokens <= context window``, always.

The report (section 09): "The summarization call reserved 4,000 free tokens but
requested max_new_tokens 8,192; at the observed median prompt of 78,541 tokens,
78,541 + 8,192 = 86,733 > 86,016, so 98.3% of 1,321 full-summary attempts
failed". Two numbers that must agree were configured separately. Here the
reserve is derived from the request, never configured on its own.
"""
from __future__ import annotations

from dataclasses import dataclass

from rl.chat import STOP_IDS
from rl.engines.protocol import GenerateRequest, SamplingParams
from rl.errors import BudgetError


@dataclass(frozen=True)
class Budget:
    """The tokens one generation call may request."""

    prompt_tokens: int
    max_new_tokens: int
    context_window: int
    clamped: bool  # True when max_new_tokens was lowered to fit

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.max_new_tokens

    def request(self, prompt: list[int], rid: str, *, temperature: float, routed_upto: int, routing: bool):
        """The engine request of this fitted call: the only way the agent loop builds one, so no
        request leaves without its budget (a turn or a summary; R3 rows from ``routed_upto``)."""
        if len(prompt) != self.prompt_tokens:
            raise BudgetError(f"{rid}: the budget was fitted for {self.prompt_tokens} prompt tokens, not {len(prompt)}")
        return GenerateRequest(
            input_ids=tuple(prompt), rid=rid,
            sampling_params=SamplingParams(max_new_tokens=self.max_new_tokens, temperature=temperature,
                                           stop_token_ids=tuple(sorted(STOP_IDS))),
            return_logprob=True, return_routed_experts=routing, routed_experts_start_len=routed_upto)


def fit_generation(prompt_tokens: int, max_new_tokens: int, context_window: int,
                   min_new_tokens: int = 1, *, where: str = "generation") -> Budget:
    """Return a request that fits the context window, or raise BudgetError.

    If ``prompt + max_new_tokens`` exceeds the window, ``max_new_tokens`` is
    lowered to what is left, provided at least ``min_new_tokens`` remain; a
    prompt that leaves less than that must be compacted first (the error says
    by how much).
    """
    if min(prompt_tokens, max_new_tokens, context_window) < 0 or min_new_tokens < 1:
        raise BudgetError(f"{where}: token counts must be non-negative (prompt={prompt_tokens}, "
                          f"max_new_tokens={max_new_tokens}, context={context_window}, min_new={min_new_tokens})")
    free = context_window - prompt_tokens
    if max_new_tokens <= free:
        return Budget(prompt_tokens, max_new_tokens, context_window, clamped=False)
    if free >= min_new_tokens:
        return Budget(prompt_tokens, free, context_window, clamped=True)
    raise BudgetError(
        f"{where}: prompt of {prompt_tokens} tokens leaves {free} free in a {context_window}-token "
        f"context, below the {min_new_tokens} tokens this call needs; compact the history by at least "
        f"{min_new_tokens - free} tokens before calling",
        prompt_tokens=prompt_tokens, context_window=context_window, min_new_tokens=min_new_tokens)


CUT_REASONS = ("context_exhausted", "truncated", "max_new_tokens")


def cut_reason(budget: Budget, num_generated: int, has_tool_call: bool) -> str:
    """Why a reply that ended without a stop token ends the episode, one meaning per name (both
    agents: ``rl.agent.loop`` and the harness session, ``rl.harness.session``):

    - ``context_exhausted``: the reply filled the context window (its ``max_new_tokens`` was
      lowered to what the context had left, and it used all of it);
    - ``truncated``: the per-turn cap ``max_new_tokens`` was reached with no tool call in the
      reply: the SkyRL walkthrough's rule (section 5), which ``rollout.truncated_reward_zero``
      trains at reward 0;
    - ``max_new_tokens``: the per-turn cap cut a reply that did call a tool.
    """
    if budget.prompt_tokens + num_generated >= budget.context_window:
        return "context_exhausted"
    return "max_new_tokens" if has_tool_call else "truncated"


def compaction_threshold(context_window: int, request_tokens: int) -> int:
    """The prompt length past which history must be compacted before the summary call.

    ``request_tokens`` is derived from the requests it protects, never configured on its own
    (the report's 4,000 vs 8,192): at least the summary's ``max_new_tokens``. Its production
    caller, ``rl.agent.compaction``, passes one more turn's reply + the summarise instruction +
    the summary request (docs/compaction.md).
    """
    if request_tokens >= context_window:
        raise BudgetError(f"compaction needs {request_tokens} tokens (summary request and what it protects) "
                          f">= context window {context_window}; lower rollout.summary_max_new_tokens or "
                          "max_new_tokens, or raise context_window",
                          context_window=context_window, request_tokens=request_tokens)
    return context_window - request_tokens
