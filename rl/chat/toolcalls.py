"""Qwen ``<tool_call>`` output -> OpenAI ``tool_calls`` (and what to tell the model when it fails).

A Qwen3 assistant turn is ``[<think>reasoning</think>\\n\\n]content[\\n<tool_call>\\n{"name":
..., "arguments": {...}}\\n</tool_call>]...``. :func:`parse_reply` splits it into
``reasoning``, ``content`` and OpenAI tool calls whose ``arguments`` string is
the exact JSON text the model generated (so a harness that sends it back
unchanged re-renders the same tokens: the strict relation); only when the
block does not have the template's ``{"name": ..., "arguments": ...}`` order is
the object re-serialised.

A reply that tries to call a tool and fails (bad JSON, no name, arguments not
an object, an unclosed block, a tool the request did not offer, or no call
when ``tool_choice`` demands one) is a :class:`Reply` with ``problem`` set: the
session answers it with a corrective observation, never as a final answer
(SkyRL walkthrough, section 3; docs/harness.md).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

_BLOCK_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HEAD_RE = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


@dataclass
class Reply:
    content: str
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)
    problem: str | None = None


def _split_reasoning(text: str) -> tuple[str | None, str]:
    if "</think>" not in text:
        return None, text
    head, _, tail = text.partition("</think>")
    return head.split("<think>")[-1].strip("\n"), tail.lstrip("\n")


def _parse_block(block: str) -> tuple[str, str] | str:
    """(name, arguments JSON text) or a problem description."""
    try:
        obj = json.loads(block)
    except json.JSONDecodeError as exc:
        return f"the tool call is not valid JSON ({exc.msg} at char {exc.pos})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return 'the tool call needs a "name" string'
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        return '"arguments" must be a JSON object'
    head = _HEAD_RE.match(block)
    if head is not None and json.loads(head.group(1)) == obj["name"]:
        try:
            _, end = json.JSONDecoder().raw_decode(block, head.end())
            if block[end:].strip() == "}":
                return obj["name"], block[head.end():end]
        except json.JSONDecodeError:
            pass
    return obj["name"], json.dumps(args, ensure_ascii=False)


def parse_reply(text: str, *, offered: set[str] | None = None, required: str | None = None,
                parse_tools: bool = True) -> Reply:
    """Parse generated ``text`` (stop tokens already removed).

    ``offered``: tool names the request declared (None: any name accepted);
    ``required``: ``"*"`` for ``tool_choice="required"``, a name for a forced
    function, None for ``auto``; ``parse_tools=False`` for ``tool_choice="none"``.
    """
    reasoning, body = _split_reasoning(text)
    if not parse_tools:
        return Reply(content=body, reasoning=reasoning)
    first = body.find("<tool_call>")
    if first < 0:
        if required is not None:
            need = "a tool" if required == "*" else f"the tool {required!r}"
            return Reply(content=body, reasoning=reasoning, problem=f"this request requires you to call {need}")
        return Reply(content=body, reasoning=reasoning)
    content = body[:first].rstrip("\n")
    calls, problems = [], []
    rest = body[first:]
    for block in _BLOCK_RE.findall(rest):
        parsed = _parse_block(block)
        if isinstance(parsed, str):
            problems.append(parsed)
            continue
        name, args = parsed
        if offered is not None and name not in offered:
            problems.append(f"unknown tool {name!r}; available: {sorted(offered)}")
        elif required not in (None, "*") and name != required:
            problems.append(f"this request requires the tool {required!r}, not {name!r}")
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name, "arguments": args}})
    if rest.count("<tool_call>") != rest.count("</tool_call>"):
        problems.append("a <tool_call> block is not closed with </tool_call>")
    if problems:
        return Reply(content=content, reasoning=reasoning, tool_calls=calls,
                     problem="; ".join(problems) + '. Reply with <tool_call>\n{"name": <function-name>, '
                     '"arguments": <args-json-object>}\n</tool_call>')
    return Reply(content=content, reasoning=reasoning, tool_calls=calls)
