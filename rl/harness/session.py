"""One trial's session behind the OpenAI endpoint: messages in, TITO trajectory recorded.

Per request (:meth:`HarnessSession.complete`):

1. render the harness's messages and tools with the Qwen3 template and encode
   them with the real tokenizer (:mod:`rl.chat.template`);
2. check the turn and context budgets (``prompt + max_new_tokens <= context``,
   ``rl.agent.budget``); a request over budget is an OpenAI error, never a
   silently shortened prompt;
3. generate through ``generate`` (in a campaign: the guarded engine pool, so
   routing, weight versions, resubmission and the sync barrier apply);
4. record the turn: the first with ``TitoBuilder(prompt).add_generation``,
   later ones with ``add_turn(prompt, ...)`` which relates the harness's prompt
   to the stream (strict -> normalized -> retokenized -> split; the split chunk
   keeps the group id). The stream always keeps the sampled ids;
5. parse Qwen ``<tool_call>`` blocks into OpenAI ``tool_calls``. A reply that
   tried and failed to call a tool gets a corrective observation appended to
   the stream and is generated again (at most ``max_corrections`` times; then an
   OpenAI error with code ``tool_call_unparseable``): it is never returned as a
   final answer.

:meth:`HarnessSession.finish` returns the trajectory chunks; ``stats()`` the
relations, corrections and end reason. A session serialises its requests (a
harness that sends two at once gets them one after the other).
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from rl.agent.budget import Budget, cut_reason, fit_generation
from rl.agent.response import policy_version  # one version per turn, or per token across a sync
from rl.chat import STOP_IDS, ChatRenderer, token_bytes
from rl.engines.protocol import GenerateRequest, GenerateResponse, SamplingParams
from rl.errors import BudgetError, ParseError
from rl.harness.openai_api import ApiError, ChatRequest, Completion
from rl.chat.template import render
from rl.chat.toolcalls import Reply, parse_reply
from rl.tito import TitoBuilder, Trajectory

CORRECTION_PREFIX = "[parse error] "


@dataclass(frozen=True)
class SessionLimits:
    """Budgets of one session (a trial's, in a campaign; field names follow ``RolloutConfig``)."""

    max_turns: int = 16                 # engine calls, corrective retries included
    max_new_tokens: int = 512           # cap on one reply, whatever the request asks
    context_window: int = 4096
    min_new_tokens: int = 8
    temperature: float | None = None    # set: pinned (a campaign trains at its own temperature)
    default_temperature: float = 1.0    # used when neither pinned nor requested
    max_corrections: int = 2            # corrective observations per request
    num_layers: int | None = None       # set both to require routing on every turn (R3)
    topk: int | None = None


class HarnessSession:
    """Records one trajectory from a harness's chat requests (see module docstring)."""

    def __init__(self, session_id: str, generate: Callable[[GenerateRequest], GenerateResponse],
                 renderer: ChatRenderer, limits: SessionLimits = SessionLimits(), *, sample_id: str | None = None,
                 group_id: str = "", prompt_id: str = "") -> None:
        self.session_id, self.generate, self.renderer, self.limits = session_id, generate, renderer, limits
        self.sample_id, self.group_id, self.prompt_id = sample_id or session_id, group_id, prompt_id
        self.builder: TitoBuilder | None = None
        self.num_calls = 0
        self.num_requests = 0
        self.parse_failures = 0
        self.relations: Counter[str] = Counter()
        self.end_reason = "done"
        self.generate_s = 0.0
        self.temperature_overrides = 0
        self.emission_log = None  # an rl.engines.emission_log.EmissionLog (the OpenAI endpoint's record)
        self.last_relation = ""
        self.last_cut: str | None = None  # why the latest reply had no stop token (rl.agent.budget.cut_reason)
        self._last_budget: Budget | None = None
        self.fatal: BaseException | None = None
        self._routed_upto = 0
        self._lock = threading.Lock()
        self.closed = False

    # -- the request path
    def complete(self, req: ChatRequest) -> Completion:
        """Serve one request (see module docstring). An error that is not the request's fault
        (missing routing, a dead engine pool, a cancelled trial) is kept in ``self.fatal``: the
        harness gets a 500, and the trial re-raises it afterwards instead of ending quietly."""
        try:
            return self._complete(req)
        except ApiError:
            raise
        except BaseException as exc:
            self.fatal = self.fatal or exc
            raise

    def _complete(self, req: ChatRequest) -> Completion:
        with self._lock:
            if self.closed:
                raise ApiError(409, f"session {self.session_id} is closed (its trial finished)",
                               code="session_closed")
            self.num_requests += 1
            prompt = self.renderer.encode(render(req.messages, req.tools))
            resp = self._generate(prompt, req, continuation=False)
            reply = self._parse(resp, req)
            corrections = 0
            while reply.problem is not None and self._stopped(resp) and corrections < self.limits.max_corrections:
                self.parse_failures += 1
                corrections += 1
                obs = self.renderer.observation_ids([{"role": "tool", "content": CORRECTION_PREFIX + reply.problem}],
                                                    int(resp.output_ids[-1]), sample=self.sample_id,
                                                    turn=self.num_calls - 1)
                self.builder.add_observation(obs)
                resp = self._generate(self.builder.tokens, req, continuation=True)
                reply = self._parse(resp, req)
            if reply.problem is not None and self._stopped(resp):
                self.parse_failures += 1
                self.end_reason = "unparseable_tool_call"
                raise ApiError(422, f"the model's tool call could not be parsed after {corrections} corrective "
                               f"observation(s): {reply.problem}", type="invalid_response_error",
                               code="tool_call_unparseable")
            return self._completion(prompt, resp, reply, req)

    def _parse(self, resp: GenerateResponse, req: ChatRequest) -> Reply:
        ids = [int(i) for i in resp.output_ids]
        while ids and ids[-1] in STOP_IDS:
            ids.pop()
        return parse_reply(self.renderer.decode(ids), offered=req.offered, required=req.required_tool,
                           parse_tools=req.tool_choice != "none")

    @staticmethod
    def _stopped(resp: GenerateResponse) -> bool:
        return bool(resp.output_ids) and int(resp.output_ids[-1]) in STOP_IDS

    def _sampling(self, req: ChatRequest, max_new: int) -> SamplingParams:
        temperature = self.limits.temperature
        if temperature is None:
            temperature = self.limits.default_temperature if req.temperature is None else req.temperature
        elif req.temperature is not None and req.temperature != temperature:
            self.temperature_overrides += 1  # the trainer's log-probs assume the campaign's temperature
        return SamplingParams(max_new_tokens=max_new, temperature=temperature, top_p=req.top_p,
                              stop_token_ids=tuple(sorted(STOP_IDS)), sampling_seed=req.seed)

    def _generate(self, prompt: list[int], req: ChatRequest, *, continuation: bool) -> GenerateResponse:
        lim = self.limits
        if self.num_calls >= lim.max_turns:
            self.end_reason = "max_turns"
            raise ApiError(400, f"session {self.session_id}: the turn budget of {lim.max_turns} model calls is "
                           "spent; end the episode", code="turn_budget_exhausted")
        want = min(req.max_tokens or lim.max_new_tokens, lim.max_new_tokens)
        try:
            budget = fit_generation(len(prompt), want, lim.context_window, min(lim.min_new_tokens, want),
                                    where=f"session {self.session_id} call {self.num_calls}")
        except BudgetError as err:
            self.end_reason = "context_exhausted"
            raise ApiError(400, str(err), param="messages", code="context_length_exceeded") from None
        self._last_budget = budget
        start = self._routed_upto if continuation else 0
        request = GenerateRequest(input_ids=tuple(prompt), rid=f"{self.sample_id}-c{self.num_calls}",
                                  sampling_params=self._sampling(req, budget.max_new_tokens),
                                  return_logprob=True, return_routed_experts=lim.num_layers is not None,
                                  routed_experts_start_len=start)
        t0 = time.monotonic()
        try:
            resp = self.generate(request)
        except ParseError as err:
            raise ApiError(502, f"the engine's answer was malformed: {err}", type="server_error",
                           code="engine_error") from None
        self.generate_s += time.monotonic() - t0
        if resp.finish_reason.is_abort:
            raise ApiError(503, f"generation aborted by the engine ({resp.finish_reason.message}); retry",
                           type="server_error", code="engine_aborted")
        if self.emission_log is not None:  # the endpoint's own record of what it relayed (the audit's)
            self.emission_log.record(request.rid, resp.output_ids, resp.weight_version, resp.finish_reason.type)
        self._record(prompt, resp, start, continuation, request.rid)
        return resp

    def _record(self, prompt: list[int], resp: GenerateResponse, start: int, continuation: bool,
                rid: str | None = None) -> None:
        lp = resp.output_token_logprobs or ()
        kw: dict[str, Any] = dict(policy_version=policy_version(resp), routing_rows=resp.routed_experts_RLK,
                                  routing_start=start, rid=rid)
        if self.builder is None:
            self.builder = TitoBuilder(prompt, sample_id=self.sample_id, group_id=self.group_id,
                                       prompt_id=self.prompt_id, tokenizer=self.renderer.tokenizer,
                                       num_layers=self.limits.num_layers, topk=self.limits.topk)
            self.builder.add_generation(resp.output_ids, lp, **kw)
            relation = "strict"
        elif continuation:
            self.builder.add_generation(resp.output_ids, lp, **kw)
            relation = "strict"
        else:
            relation = self.builder.add_turn(prompt, resp.output_ids, lp, **kw)
        self.relations[relation] += 1
        self.last_relation = relation
        self.num_calls += 1
        self._routed_upto = len(self.builder.tokens) - 1

    def _completion(self, prompt: list[int], resp: GenerateResponse, reply: Reply, req: ChatRequest) -> Completion:
        self.last_cut = None
        if not self._stopped(resp):
            finish = "length"
            self.last_cut = cut_reason(self._last_budget, len(resp.output_ids), bool(reply.tool_calls))
        else:
            finish = "tool_calls" if reply.tool_calls else "stop"
        lps = []
        if req.logprobs:
            tok = self.renderer.tokenizer
            for i, lp in zip(resp.output_ids, resp.output_token_logprobs or ()):
                raw = token_bytes(tok, int(i))
                lps.append((raw.decode("utf-8", errors="replace"), float(lp), list(raw)))
        return Completion(content=reply.content, reasoning=reply.reasoning, tool_calls=reply.tool_calls,
                          finish_reason=finish, prompt_tokens=len(prompt), completion_tokens=len(resp.output_ids),
                          token_logprobs=lps, weight_version=str(resp.weight_version),
                          relation=self.last_relation)

    # -- the trial's side
    def close(self) -> None:
        with self._lock:
            self.closed = True

    def finish(self) -> list[Trajectory]:
        """The recorded chunks (invariants checked); [] when the harness never called the model."""
        with self._lock:
            return [] if self.builder is None else self.builder.finish()

    def stats(self) -> dict:
        """``end_reason``: the session's own (a budget it refused), else why the last reply was cut
        (``context_exhausted``, ``truncated``, ``max_new_tokens``: the trajectory ends with that reply,
        whatever the harness did next), else "done"."""
        end = self.last_cut if self.end_reason == "done" and self.last_cut is not None else self.end_reason
        return {"requests": self.num_requests, "model_calls": self.num_calls, "parse_failures": self.parse_failures,
                "relations": dict(self.relations), "end_reason": end,
                "temperature_overrides": self.temperature_overrides, "generate_s": self.generate_s}
