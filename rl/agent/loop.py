"""The agent loop: engine -> tool call -> sandbox -> observation -> engine.

One trial, token-in/token-out: the next prompt is always the TITO stream
itself (``TitoBuilder.tokens``), so the trainer sees exactly the ids the engine
sampled, and routing rows are stitched turn by turn. The harness never
re-renders parsed history.

Turn protocol (Qwen tool calling): the assistant answers with one
``<tool_call>{"name": "bash", "arguments": {"command": ...}}</tool_call>``;
the command runs in the trial's sandbox and its output comes back as a
``tool`` message. An answer with no tool call ends the episode. A tool call
that does not parse gets a corrective observation (the turn still counts).
A generation that ends without a stop token ends the trajectory (a cut turn cannot be
followed by an observation); its end reason says why, one meaning per name
(``rl.agent.budget.cut_reason``): ``context_exhausted`` (the context is full),
``truncated`` (the per-turn cap with no tool call: the walkthrough's rule) or
``max_new_tokens`` (the per-turn cap cut a reply that called a tool).

Context budget: every request satisfies ``prompt + max_new_tokens <=
context_window`` (``rl.agent.budget``); a prompt that no longer leaves room
for a useful turn ends the episode with reason ``context_exhausted``. With
``summary_max_new_tokens > 0`` the loop compacts the history before that
point: a summary turn, then a new chunk from a fresh context
(``rl.agent.compaction``, docs/compaction.md).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from opentelemetry import trace

from rl.agent import budget, response
from rl.agent.compaction import Compactor
from rl.agent.settings import AgentSettings
from rl.chat import IM_END_ID, STOP_IDS, ChatRenderer, parse_assistant
from rl.chat.template import render
from rl.chat.toolcalls import parse_reply
from rl.engines.protocol import GenerateRequest
from rl.errors import BudgetError
from rl.tito import TitoBuilder, Trajectory

_NO_TRACER = trace.NoOpTracer()

SYSTEM_PROMPT = ("You are a terminal agent. Solve the task by running shell commands with the bash "
                 "tool, one command per turn. Reply without a tool call when you are done.")
TOOL_NAME = "bash"
MAX_OBSERVATION_CHARS = 2000  # long outputs are cut: the tail rarely helps a small policy


@dataclass
class Episode:
    """What the loop produced: trajectory chunks plus the facts the campaign reports."""

    chunks: list[Trajectory]
    num_turns: int
    end_reason: str                    # done | max_turns | truncated | max_new_tokens | context_exhausted
    #                                    | budget_exhausted | summary_failed
    commands: list[str] = field(default_factory=list)
    parse_failures: int = 0
    budget_clamps: int = 0
    compactions: int = 0               # summaries served (each starts a new chunk)
    summary_failures: int = 0          # summaries that could not fit or that the engine refused
    generate_s: float = 0.0


def initial_messages(instruction: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction.strip()}]


def tool_call_text(command: str) -> str:
    """The exact assistant text that calls the bash tool (used by the warm start too)."""
    args = json.dumps({"command": command}, ensure_ascii=False)
    return '<tool_call>\n{"name": "' + TOOL_NAME + '", "arguments": ' + args + '}\n</tool_call>'


def solution_command(solve_sh: str) -> str:
    """The command of a task's ``solution/solve.sh`` (shebang and comments dropped)."""
    lines = [ln for ln in solve_sh.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return " && ".join(ln.strip() for ln in lines)


def parse_command(text: str) -> tuple[str | None, str | None]:
    """(command, problem): command when one bash call parsed; problem text when the reply
    tried to call a tool and failed; (None, None) for a plain final answer."""
    msg = parse_assistant(text)
    calls = msg.get("tool_calls") or []
    if calls:
        fn = calls[0]["function"]
        args = fn.get("arguments")
        if fn.get("name") != TOOL_NAME or not isinstance(args, dict) or not isinstance(args.get("command"), str):
            return None, f"unknown tool or arguments {json.dumps(fn)[:120]}; call bash with {{\"command\": \"...\"}}"
        return args["command"], None
    if "<tool_call>" in text:
        return None, "your tool call is not valid JSON; reply with <tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"...\"}}</tool_call>"
    return None, None


def observation_text(stdout: str, stderr: str, exit_code: int | None, reason: str) -> str:
    out = (stdout + (("\n" + stderr) if stderr else "")).strip()
    if len(out) > MAX_OBSERVATION_CHARS:
        out = out[:MAX_OBSERVATION_CHARS] + f"\n[... {len(out) - MAX_OBSERVATION_CHARS} chars cut]"
    status = f"exit code {exit_code}" if reason in ("ok", "exit_nonzero") else f"stopped: {reason}"
    return f"{out}\n[{status}]" if out else f"[{status}]"


def run_episode(instruction: str, execute: Callable[[str], Any], generate: Callable[[GenerateRequest], Any],
                renderer: ChatRenderer, settings: AgentSettings, *, sample_id: str, group_id: str,
                prompt_id: str, clock: Callable[[], float] | None = None, tracer: Any = None,
                tools: Any = None) -> Episode:
    """Run one episode. ``execute(cmd)`` returns an object with stdout/stderr/exit_code/reason
    (``rl.agent.sandbox.Trial.exec``); ``generate(request)`` returns a
    ``GenerateResponse`` (an engine client or pool). Raises MissingRoutingError if
    routing is required and absent: the caller aborts the rollout, never drops it.
    ``tracer`` (an OpenTelemetry tracer) records one ``agent.turn`` span per turn,
    parent of the spans ``generate`` and ``execute`` open. ``tools`` (e.g. an
    ``rl.harness.mcp_tools.McpToolbox``: ``openai_tools`` and ``call(name, args) -> str``)
    adds tools next to bash: the prompt then carries the Qwen3 tools section and a call
    to one of them is dispatched to ``tools.call`` (docs/harness.md)."""
    clock = clock or time.monotonic
    if tools is not None:
        def encode_prompt(messages):
            return renderer.encode(render(messages, [BASH_TOOL, *tools.openai_tools]))
    else:
        encode_prompt = renderer.render_prompt
    first = encode_prompt(initial_messages(instruction))
    compactor = None if settings.summary_max_new_tokens <= 0 else Compactor(
        initial_messages(instruction), encode_prompt, renderer, settings, sample_id)
    builder = TitoBuilder(first, sample_id=sample_id,
                          group_id=group_id, prompt_id=prompt_id, tokenizer=renderer.tokenizer,
                          num_layers=settings.num_layers, topk=settings.topk)
    ep = Episode(chunks=[], num_turns=0, end_reason="max_turns")
    routed_upto = 0  # positions [0, routed_upto) already have routing rows
    for turn in range(settings.max_turns):
        turn_span = (tracer or _NO_TRACER).start_as_current_span("agent.turn", attributes={"turn": turn})
        with turn_span:
            routed_upto, stop = _turn(turn, builder, ep, execute, generate, renderer, settings, sample_id,
                                      routed_upto, clock, tools, compactor)
        if stop:
            break
    ep.chunks = builder.finish()
    return ep


def _turn(turn, builder, ep, execute, generate, renderer, settings, sample_id, routed_upto, clock, tools=None,
          compactor=None):
    """One agent turn; returns (routed_upto, whether the episode ends)."""
    prompt = builder.tokens
    try:
        fit = budget.fit_generation(len(prompt), settings.max_new_tokens, settings.context_window,
                                    settings.min_new_tokens, where=f"{sample_id} turn {turn}")
    except BudgetError:
        ep.end_reason = "context_exhausted"
        return routed_upto, True
    ep.budget_clamps += fit.clamped
    req = fit.request(prompt, f"{sample_id}-t{turn}", temperature=settings.temperature, routed_upto=routed_upto,
                      routing=settings.num_layers is not None)
    t0 = clock()
    resp = generate(req)
    ep.generate_s += clock() - t0
    response.record(builder, resp, routed_upto)
    routed_upto = len(builder.tokens) - 1
    ep.num_turns += 1
    last = int(resp.output_ids[-1])
    if last not in STOP_IDS:  # cut: the context is full, or the per-turn cap with or without a tool call
        text = renderer.decode(resp.output_ids)
        ep.end_reason = budget.cut_reason(fit, len(resp.output_ids),
                                          parse_command(text)[0] is not None or "</tool_call>" in text)
        return routed_upto, True
    tool_obs = None
    if tools is None:
        command, problem = parse_command(renderer.decode(resp.output_ids))
    else:
        command, problem, tool_obs = _dispatch_tools(renderer.decode(resp.output_ids[:-1]), tools, ep)
    if command is None and problem is None and tool_obs is None:
        ep.end_reason = "done"
        return routed_upto, True
    if problem is not None:
        ep.parse_failures += 1
        obs = f"[parse error] {problem}"
    elif tool_obs is not None:
        obs = tool_obs[:MAX_OBSERVATION_CHARS]
    else:
        ep.commands.append(command)
        res = execute(command)
        obs = observation_text(res.stdout, res.stderr, res.exit_code, res.reason)
        if res.reason == "budget_exhausted":
            ep.end_reason = "budget_exhausted"
            return routed_upto, True
    if turn + 1 < settings.max_turns:
        obs_ids = renderer.observation_ids([{"role": "tool", "content": obs}], last, sample=sample_id, turn=turn)
        if compactor is not None and compactor.due(len(builder.tokens), len(obs_ids), last):
            return compactor.compact(turn, builder, ep, generate, routed_upto, last, obs, clock)
        builder.add_observation(obs_ids)
    return routed_upto, False


BASH_TOOL = {"type": "function", "function": {
    "name": TOOL_NAME, "description": "Run one shell command in the workspace and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def _dispatch_tools(text: str, tools: Any, ep: Episode) -> tuple[str | None, str | None, str | None]:
    """(bash command, problem, other tool's result) for a reply when extra tools are offered."""
    reply = parse_reply(text, offered={TOOL_NAME, *(t["function"]["name"] for t in tools.openai_tools)})
    if reply.problem is not None:
        return None, reply.problem, None
    if not reply.tool_calls:
        return None, None, None
    fn = reply.tool_calls[0]["function"]
    args = json.loads(fn["arguments"])
    if fn["name"] == TOOL_NAME:
        if not isinstance(args.get("command"), str):
            return None, 'call bash with {"command": "..."}', None
        return args["command"], None, None
    ep.commands.append(f"[{fn['name']}] {fn['arguments'][:200]}")
    return None, None, tools.call(fn["name"], args)


def sft_example(instruction: str, command: str, renderer: ChatRenderer) -> tuple[list[int], list[int]]:
    """(tokens, loss_mask) for one warm-start example: the prompt, then the solution's tool
    call and a closing turn, with loss only on the assistant's tokens."""
    prompt = renderer.render_prompt(initial_messages(instruction))
    call = renderer.encode(tool_call_text(command)) + [IM_END_ID]
    obs = renderer.observation_ids([{"role": "tool", "content": "[exit code 0]"}], IM_END_ID)
    done = renderer.encode("Done.") + [IM_END_ID]
    tokens = prompt + call + obs + done
    mask = [0] * len(prompt) + [1] * len(call) + [0] * len(obs) + [1] * len(done)
    return tokens, mask


__all__ = ["AgentSettings", "Episode", "run_episode", "sft_example", "solution_command", "parse_command",
           "tool_call_text", "initial_messages", "observation_text"]
