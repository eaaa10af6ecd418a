"""The Qwen3 chat template, tools section included, rendered the way transformers does.

``qwen3_chat_template.jinja`` is the chat template shipped in Qwen3's
``tokenizer_config.json`` (Apache-2.0). It is rendered by
``transformers.utils.chat_template_utils.render_jinja_template`` (the
sandboxed Jinja environment behind ``apply_chat_template``, with its ``tojson``)
and encoded by the real Qwen tokenizer (:func:`rl.chat.load_tokenizer`).

OpenAI messages are normalised before rendering, never guessed: ``content``
``None`` becomes ``""``, a list of text parts is joined, and anything else
(images, unknown roles, a tool call without a name) is an InputError naming
the message and the fix.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Sequence

from rl.errors import InputError

TEMPLATE_PATH = Path(__file__).with_name("qwen3_chat_template.jinja")
ROLES = ("system", "developer", "user", "assistant", "tool")


@functools.lru_cache(maxsize=1)
def chat_template() -> str:
    return TEMPLATE_PATH.read_text()


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InputError(f"{where}.content[{j}]: only text parts are supported "
                                 f"({{\"type\": \"text\", \"text\": ...}}), got {str(part)[:80]}", where=where)
            parts.append(part["text"])
        return "".join(parts)
    raise InputError(f"{where}.content must be a string, null or a list of text parts, got "
                     f"{type(content).__name__}", where=where)


def _tool_call(call: Any, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise InputError(f"{where}: a tool call needs function.name (a non-empty string), got {str(call)[:120]}",
                         where=where)
    args = fn.get("arguments", "{}")
    if not isinstance(args, (str, dict)):
        raise InputError(f"{where}.function.arguments must be a JSON string or an object, got "
                         f"{type(args).__name__}", where=where)
    return {"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}}


def normalize_messages(messages: Any) -> list[dict]:
    """OpenAI chat messages -> the dicts the Qwen template reads (see module docstring)."""
    if not isinstance(messages, list) or not messages:
        raise InputError("messages must be a non-empty list of chat messages", where="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise InputError(f"{where}: role must be one of {ROLES}, got {str(m)[:80]}", where=where)
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where)}
        if role == "assistant":
            if m.get("tool_calls"):
                if not isinstance(m["tool_calls"], list):
                    raise InputError(f"{where}.tool_calls must be a list", where=where)
                msg["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(m["tool_calls"])]
            if isinstance(m.get("reasoning_content"), str):
                msg["reasoning_content"] = m["reasoning_content"]
        out.append(msg)
    return out


def render(messages: Sequence[dict], tools: Sequence[dict] | None = None, *,
           add_generation_prompt: bool = True) -> str:
    """The prompt text of already-normalised ``messages`` and OpenAI ``tools``."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([list(messages)], tools=list(tools) if tools else None,
                                        chat_template=chat_template(),
                                        add_generation_prompt=add_generation_prompt)
    return rendered[0]


def tools_json(tools: Sequence[dict]) -> str:
    """The tools exactly as the template prints them (one JSON object per line)."""
    return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
