"""The limits of one trial's agent loop, declared once.

``AgentLimits`` holds the ``[rollout]`` keys the loop obeys (``t1ops.config.RolloutConfig``
extends it, so the file and the loop share one declaration); ``AgentSettings`` adds what the
campaign derives (R3 routing shape) and the loop's own constants. Pydantic models: the
campaign hands them to the workers as they are.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AgentLimits(BaseModel):
    """Limits of one trial that a campaign configures (``[rollout]``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    max_turns: int = Field(4, ge=1, le=1000, description="Agent turns per trial.")
    max_new_tokens: int = Field(64, ge=1, description="Tokens one turn may generate.")
    context_window: int = Field(1024, ge=64, description="Context window in tokens; prompt + max_new_tokens never exceeds it.")
    summary_max_new_tokens: int = Field(0, ge=0, description="History compaction (builtin agent, docs/compaction.md): the summary request's max_new_tokens; the loop summarises before the history leaves too little room for it (the trigger is derived from this request, never a separate reserve) and continues from system + task + summary as a new trajectory chunk. 0: off (a full context ends the trial with 'context_exhausted'). summary_max_new_tokens + max_new_tokens must be below context_window.")
    temperature: float = Field(1.0, ge=0, le=4, description="Sampling temperature.")


class AgentSettings(AgentLimits):
    """Limits of one trial (``AgentLimits``, plus what the campaign derives)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    min_new_tokens: int = Field(8, ge=1, description="A turn with less room than this is not worth sampling.")
    num_layers: int | None = Field(None, ge=1, description="Set with topk to require routing on every turn (R3).")
    topk: int | None = Field(None, ge=1, description="Experts per token of the routing rows (R3).")
    command_timeout_s: float = Field(20.0, gt=0, description="Timeout of one shell command of the builtin agent.")
