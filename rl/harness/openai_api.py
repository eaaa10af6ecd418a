"""The OpenAI chat-completions wire format: request validation, responses, stream chunks, errors.

Requests are validated by a pydantic model that forbids unknown fields, so a
parameter this endpoint does not implement is refused by name instead of being
ignored (``n`` > 1, ``stop`` strings, penalties, ``top_logprobs`` > 0, non-text
content parts). Errors have OpenAI's shape::

    {"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": ...}}

Responses follow ``chat.completion`` / ``chat.completion.chunk``: ``choices[0].message``
with ``content``, ``tool_calls`` (``arguments`` a JSON string) and
``reasoning_content``; ``finish_reason`` ``stop`` | ``length`` | ``tool_calls``;
``logprobs.content`` per sampled token; ``usage``.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rl.errors import InputError
from rl.chat.template import normalize_messages


class ApiError(Exception):
    """An error the endpoint answers with an OpenAI-shaped body and ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",  # noqa: A002
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Function(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: _Function


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The fields of ``POST /v1/chat/completions`` this endpoint implements (others are refused)."""

    model_config = ConfigDict(extra="forbid")
    model: str = "t1ops"
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[_Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=0)
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=1)
    seed: int | None = None
    stop: None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None


@dataclass
class ChatRequest:
    """A validated request, messages normalised for the Qwen template."""

    messages: list[dict]
    tools: list[dict]
    tool_choice: str | dict
    temperature: float | None
    top_p: float
    max_tokens: int | None
    logprobs: bool
    stream: bool
    include_usage: bool
    user: str | None
    model: str
    seed: int | None

    @property
    def offered(self) -> set[str] | None:
        return {t["function"]["name"] for t in self.tools} if self.tools else None

    @property
    def required_tool(self) -> str | None:
        if self.tool_choice == "required":
            return "*"
        if isinstance(self.tool_choice, dict):
            return self.tool_choice["function"]["name"]
        return None


def _validation_error(err: ValidationError) -> ApiError:
    e = err.errors()[0]
    param = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        msg = f"unsupported parameter '{param}': this endpoint does not implement it (see docs/harness.md)"
    else:
        msg = f"invalid '{param}': {e['msg']}"
    return ApiError(400, msg, param=param, code="unsupported_parameter" if e["type"] == "extra_forbidden"
                    else "invalid_value")


def parse_request(body: Any) -> ChatRequest:
    """Validate a request body; ApiError(400) naming the parameter on any problem."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as err:
        raise _validation_error(err) from None
    try:
        messages = normalize_messages(req.messages)
    except InputError as err:
        raise ApiError(400, str(err), param="messages", code="invalid_value") from None
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    choice: str | dict = req.tool_choice or "auto"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
            raise ApiError(400, "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                           "\"function\": {\"name\": <one of the request's tools>}}", param="tool_choice",
                           code="invalid_value")
    elif choice == "required" and not tools:
        raise ApiError(400, "tool_choice 'required' needs a non-empty 'tools' list", param="tool_choice",
                       code="invalid_value")
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise ApiError(400, "max_tokens and max_completion_tokens disagree; send one of them",
                       param="max_tokens", code="invalid_value")
    return ChatRequest(messages=messages, tools=tools, tool_choice=choice, temperature=req.temperature,
                       top_p=1.0 if req.top_p is None else req.top_p,
                       max_tokens=req.max_completion_tokens or req.max_tokens, logprobs=bool(req.logprobs),
                       stream=bool(req.stream), include_usage=bool(req.stream_options and
                                                                    req.stream_options.include_usage),
                       user=req.user, model=req.model, seed=req.seed)


@dataclass
class Completion:
    """What one request produced (the session fills it)."""

    content: str
    reasoning: str | None
    tool_calls: list[dict]
    finish_reason: str                  # stop | length | tool_calls
    prompt_tokens: int
    completion_tokens: int
    token_logprobs: list[tuple[str, float, list[int]]] = field(default_factory=list)
    weight_version: str = ""
    relation: str = "strict"
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))


def _message(c: Completion) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": c.content if (c.content or not c.tool_calls) else None}
    if c.tool_calls:
        msg["tool_calls"] = c.tool_calls
    if c.reasoning is not None:
        msg["reasoning_content"] = c.reasoning
    return msg


def _logprobs(c: Completion, want: bool) -> dict | None:
    if not want:
        return None
    return {"content": [{"token": t, "logprob": lp, "bytes": b, "top_logprobs": []}
                        for t, lp, b in c.token_logprobs]}


def _usage(c: Completion) -> dict:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens}


def completion_json(c: Completion, req: ChatRequest) -> dict:
    """A ``chat.completion`` object."""
    return {"id": c.id, "object": "chat.completion", "created": c.created, "model": req.model,
            "system_fingerprint": f"weights-{c.weight_version}",
            "choices": [{"index": 0, "message": _message(c), "finish_reason": c.finish_reason,
                         "logprobs": _logprobs(c, req.logprobs)}],
            "usage": _usage(c)}


def stream_events(c: Completion, req: ChatRequest) -> list[str]:
    """Server-sent events of a ``chat.completion.chunk`` stream (the whole reply, then [DONE])."""
    base = {"id": c.id, "object": "chat.completion.chunk", "created": c.created, "model": req.model,
            "system_fingerprint": f"weights-{c.weight_version}"}

    def chunk(delta: dict, finish: str | None = None, logprobs: dict | None = None, **extra) -> str:
        body = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}],
                **extra}
        return "data: " + json.dumps(body, ensure_ascii=False) + "\n\n"

    msg = _message(c)
    events = [chunk({"role": "assistant", "content": ""})]
    if msg.get("reasoning_content") is not None:
        events.append(chunk({"reasoning_content": msg["reasoning_content"]}))
    if msg["content"]:
        events.append(chunk({"content": msg["content"]}, logprobs=_logprobs(c, req.logprobs)))
    for i, call in enumerate(c.tool_calls):
        events.append(chunk({"tool_calls": [{"index": i, **call}]}))
    events.append(chunk({}, c.finish_reason))
    if req.include_usage:
        events.append("data: " + json.dumps({**base, "choices": [], "usage": _usage(c)}) + "\n\n")
    events.append("data: [DONE]\n\n")
    return events
