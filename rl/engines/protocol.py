"""SGLang's HTTP schema as typed dataclasses, with strict parsers for both sides.

One module for the wire format, used by the client (:mod:`rl.engines.client`)
and by the embedded engine's server, so both speak exactly the same API.
Field names follow SGLang's ``sglang/srt/managers/io_struct.py``
(``GenerateReqInput``, ``PauseGenerationReqInput``, ``UpdateWeightFromDiskReqInput``,
``AbortReq``...) and ``sglang/srt/entrypoints/http_server.py``, checked against
the release in :data:`SGLANG_SCHEMA_VERSION`.

Contract of ``/generate`` (non-streaming, one prompt):

- request: ``input_ids``, ``sampling_params``, ``return_logprob``,
  ``return_routed_experts``, ``routed_experts_start_len`` (absolute start
  position; the routing covers ``[start_len, len(prompt) + len(output) - 1)``).
- response: ``output_ids``, ``meta_info.finish_reason`` (``{"type": "stop" |
  "length" | "abort", ...}``), ``meta_info.weight_version`` (a string),
  ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` per output
  token), ``meta_info.routed_experts`` (base64 of little-endian int32,
  ``rows x num_moe_layers x topk`` flattened).

The control endpoints (pause, continue, weight loads, abort, model info) are typed in
:mod:`rl.engines.protocol_control`, the distributed weight-update ones in
:mod:`rl.engines.protocol_weights`; the strict JSON readers all three use are in
:mod:`rl.engines.wire`.

Parsers never fill in a default for a missing field: a malformed payload
raises :class:`~rl.errors.ParseError` (or :class:`~rl.errors.RoutingError` /
:class:`~rl.errors.MissingRoutingError` for routing) naming the field and the
counts, because a silently repaired response would corrupt the training data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rl.engines.wire import as_bool, as_ids, as_int, as_num, as_obj, as_str, no_unknown, opt_str, or_default, require
from rl.errors import MissingRoutingError, ParseError
from rl.routing import decode_routed_experts, encode_routed_experts, expected_num_rows

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "missing-routing": ("trainer.r3",),
    "nonfinite-logprob": ("rollout.failed_trials",),
}

#: SGLang release whose ``io_struct.py`` / ``http_server.py`` this schema was checked against.
SGLANG_SCHEMA_VERSION = "0.5.23"

# Endpoint paths (http_server.py).
GENERATE = "/generate"
HEALTH = "/health"
HEALTH_GENERATE = "/health_generate"
PAUSE_GENERATION = "/pause_generation"
CONTINUE_GENERATION = "/continue_generation"
UPDATE_WEIGHTS_FROM_DISK = "/update_weights_from_disk"
UPDATE_WEIGHT_VERSION = "/update_weight_version"
ABORT_REQUEST = "/abort_request"
FLUSH_CACHE = "/flush_cache"
MODEL_INFO = "/model_info"

FinishType = Literal["stop", "length", "abort"]


# --- /generate --------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingParams:
    """The subset of SGLang's ``SamplingParams`` an RL rollout uses.

    ``temperature == 0`` means greedy (SGLang maps it to ``top_k = 1``);
    ``top_k == -1`` means the whole vocabulary.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    sampling_seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ParseError(f"sampling_params.max_new_tokens must be >= 1, got {self.max_new_tokens}",
                             field="sampling_params.max_new_tokens")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ParseError(f"sampling_params.temperature must be finite and >= 0, got {self.temperature}",
                             field="sampling_params.temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise ParseError(f"sampling_params.top_p must be in (0, 1], got {self.top_p}",
                             field="sampling_params.top_p")
        if self.top_k != -1 and self.top_k < 1:
            raise ParseError(f"sampling_params.top_k must be -1 (all) or >= 1, got {self.top_k}",
                             field="sampling_params.top_k")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                             "top_p": self.top_p, "top_k": self.top_k, "ignore_eos": self.ignore_eos}
        if self.stop_token_ids:
            d["stop_token_ids"] = list(self.stop_token_ids)
        if self.sampling_seed is not None:
            d["sampling_seed"] = self.sampling_seed
        return d

    @classmethod
    def from_json(cls, d: Any) -> "SamplingParams":
        w = "sampling_params"
        no_unknown(as_obj(d, w), {f for f in cls.__dataclass_fields__}, w)
        seed = d.get("sampling_seed")
        return cls(
            max_new_tokens=as_int(require(d, "max_new_tokens", w), f"{w}.max_new_tokens"),
            temperature=as_num(d.get("temperature", 1.0), f"{w}.temperature"),
            top_p=as_num(d.get("top_p", 1.0), f"{w}.top_p"),
            top_k=as_int(d.get("top_k", -1), f"{w}.top_k"),
            stop_token_ids=as_ids(or_default(d.get("stop_token_ids"), []), f"{w}.stop_token_ids"),
            ignore_eos=as_bool(d.get("ignore_eos", False), f"{w}.ignore_eos"),
            sampling_seed=None if seed is None else as_int(seed, f"{w}.sampling_seed"),
        )


@dataclass(frozen=True)
class GenerateRequest:
    """Body of ``POST /generate`` for one prompt given as token ids (``GenerateReqInput``)."""

    input_ids: tuple[int, ...]
    sampling_params: SamplingParams
    return_logprob: bool = True
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    rid: str | None = None

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise ParseError("input_ids: empty prompt; /generate needs at least one token id",
                             field="input_ids")
        if not 0 <= self.routed_experts_start_len <= len(self.input_ids):
            raise ParseError(
                f"routed_experts_start_len: {self.routed_experts_start_len} outside "
                f"[0, {len(self.input_ids)}] (must be within the prompt)",
                field="routed_experts_start_len", num_prompt_tokens=len(self.input_ids))

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "input_ids": list(self.input_ids), "sampling_params": self.sampling_params.to_json(),
            "return_logprob": self.return_logprob, "return_routed_experts": self.return_routed_experts,
            "routed_experts_start_len": self.routed_experts_start_len, "stream": False}
        if self.rid is not None:
            d["rid"] = self.rid
        return d

    @classmethod
    def from_json(cls, d: Any) -> "GenerateRequest":
        """Server side: parse and validate a request body; streaming and text prompts are refused."""
        w = "generate"
        no_unknown(as_obj(d, w), {
            "input_ids", "sampling_params", "return_logprob", "return_routed_experts",
            "routed_experts_start_len", "rid", "stream"}, w)
        if d.get("stream", False):
            raise ParseError("generate.stream: streaming is not supported; send stream=false",
                             field="generate.stream")
        rid = d.get("rid")
        return cls(
            input_ids=as_ids(require(d, "input_ids", w), "input_ids"),
            sampling_params=SamplingParams.from_json(require(d, "sampling_params", w)),
            return_logprob=as_bool(d.get("return_logprob", False), "return_logprob"),
            return_routed_experts=as_bool(d.get("return_routed_experts", False), "return_routed_experts"),
            routed_experts_start_len=as_int(d.get("routed_experts_start_len", 0), "routed_experts_start_len"),
            rid=None if rid is None else as_str(rid, "rid"),
        )

    def num_routing_rows(self, num_output_tokens: int) -> int:
        """Rows SGLang returns: positions ``[start_len, len(prompt) + num_output - 1)``."""
        return expected_num_rows(len(self.input_ids) + num_output_tokens, self.routed_experts_start_len)


@dataclass(frozen=True)
class FinishReason:
    """``meta_info.finish_reason`` (``BaseFinishReason.to_json()`` in schedule_batch.py)."""

    type: FinishType
    matched: int | str | None = None     # stop: the matched token id or stop string
    length: int | None = None            # length: the max_new_tokens that was hit
    message: str | None = None           # abort: why
    status_code: int | None = None       # abort: HTTP-like code

    @property
    def is_abort(self) -> bool:
        return self.type == "abort"

    def to_json(self) -> dict[str, Any]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message or "Aborted", "status_code": self.status_code}

    @classmethod
    def from_json(cls, d: Any) -> "FinishReason":
        w = "meta_info.finish_reason"
        if d is None:
            raise ParseError(f"{w}: null (request unfinished); a non-streaming response must be finished",
                             field=w)
        kind = require(d, "type", w)
        if kind not in ("stop", "length", "abort"):
            raise ParseError(f"{w}.type: {kind!r} is not one of stop/length/abort", field=f"{w}.type")
        status, matched = d.get("status_code"), d.get("matched")
        if isinstance(matched, bool) or not isinstance(matched, (int, str, type(None))):
            raise ParseError(f"{w}.matched: expected a token id, a stop string or null, got {matched!r}",
                             field=f"{w}.matched")
        return cls(type=kind, matched=matched,
                   length=None if d.get("length") is None else as_int(d["length"], f"{w}.length"),
                   message=None if d.get("message") is None else as_str(d["message"], f"{w}.message"),
                   status_code=None if status is None else as_int(status, f"{w}.status_code"))


@dataclass(frozen=True)
class WeightVersionSpan:
    """``meta_info.weight_versions[i]``: output tokens ``[start, end)`` came from ``version``."""

    version: str
    start: int
    end: int


@dataclass(frozen=True)
class GenerateResponse:
    """One finished ``/generate`` response, validated against its request."""

    output_ids: tuple[int, ...]
    finish_reason: FinishReason
    weight_version: str
    prompt_tokens: int
    completion_tokens: int
    rid: str | None = None
    text: str | None = None
    output_token_logprobs: tuple[float, ...] | None = None   # one per output id
    routed_experts_RLK: np.ndarray | None = field(default=None, compare=False)
    weight_versions: tuple[WeightVersionSpan, ...] = ()

    @property
    def spans_versions(self) -> bool:
        """True when the output was sampled under more than one weight version."""
        return len({s.version for s in self.weight_versions}) > 1

    def to_json(self) -> dict[str, Any]:
        """Server side: the JSON body SGLang would send for this response."""
        meta: dict[str, Any] = {
            "id": self.rid, "finish_reason": self.finish_reason.to_json(),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "weight_version": self.weight_version}
        if self.output_token_logprobs is not None:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in
                                             zip(self.output_token_logprobs, self.output_ids)]
            meta["output_token_logprobs_length"] = len(self.output_token_logprobs)
        if self.routed_experts_RLK is not None:
            meta["routed_experts"] = encode_routed_experts(self.routed_experts_RLK)
        if self.weight_versions:
            meta["weight_versions"] = [{"version": s.version, "start": s.start, "end": s.end}
                                       for s in self.weight_versions]
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}


def _parse_logprobs(meta: dict, output_ids: tuple[int, ...]) -> tuple[float, ...]:
    name = "meta_info.output_token_logprobs"
    rows = require(meta, "output_token_logprobs", "meta_info")
    if not isinstance(rows, list) or len(rows) != len(output_ids):
        n = len(rows) if isinstance(rows, list) else type(rows).__name__
        raise ParseError(f"{name}: {n} entries for {len(output_ids)} output ids (must be one per token)",
                         field=name, num_output_ids=len(output_ids))
    out = []
    for i, (row, tok) in enumerate(zip(rows, output_ids)):
        if not isinstance(row, (list, tuple)) or len(row) < 2:
            raise ParseError(f"{name}[{i}]: expected [logprob, token_id, text], got {row!r}", field=name,
                             index=i)
        lp = as_num(row[0], f"{name}[{i}][0]")
        if lp > 0:
            raise ParseError(f"{name}[{i}][0]: log-prob {lp} > 0", field=name, index=i)
        if as_int(row[1], f"{name}[{i}][1]") != tok:
            raise ParseError(f"{name}[{i}]: token id {row[1]} differs from output_ids[{i}] = {tok}",
                             field=name, index=i)
        out.append(lp)
    return tuple(out)


def _parse_spans(spans: Any, num_output: int) -> tuple[WeightVersionSpan, ...]:
    w = "meta_info.weight_versions"
    if spans is None:
        return ()
    if not isinstance(spans, list):
        raise ParseError(f"{w}: expected a list of {{version, start, end}} objects, got {type(spans).__name__}",
                         field=w)
    out = tuple(WeightVersionSpan(version=as_str(require(s, "version", f"{w}[{i}]"), f"{w}[{i}].version"),
                                  start=as_int(require(s, "start", f"{w}[{i}]"), f"{w}[{i}].start"),
                                  end=as_int(require(s, "end", f"{w}[{i}]"), f"{w}[{i}].end"))
                for i, s in enumerate(spans))
    for i, span in enumerate(out):
        if not 0 <= span.start <= span.end <= num_output:
            raise ParseError(f"{w}[{i}]: span [{span.start}, {span.end}) is not within the {num_output} output "
                             "tokens", field=w, index=i)
    return out


def parse_generate_response(payload: Any, request: GenerateRequest, *, num_moe_layers: int | None = None,
                            topk: int | None = None, num_experts: int | None = None) -> GenerateResponse:
    """Client side: validate a ``/generate`` body against the request that produced it.

    ``num_moe_layers`` and ``topk`` are required when the request asked for
    routing (``num_experts`` adds an id range check); rows are decoded by
    :func:`rl.routing.decode_routed_experts` to ``(len(prompt) + len(output) - 1
    - routed_experts_start_len, num_moe_layers, topk)``. An aborted response (``finish_reason.type == "abort"``) is
    returned as such, without logprob/routing checks: the caller resubmits or
    fails it; it never enters training. A finished response that asked for
    routing and carries none raises :class:`MissingRoutingError`.
    """
    meta = require(payload, "meta_info", "response")
    output_ids = as_ids(require(payload, "output_ids", "response"), "output_ids")
    finish = FinishReason.from_json(require(meta, "finish_reason", "meta_info"))
    spans = _parse_spans(meta.get("weight_versions"), len(output_ids))
    base = dict(output_ids=output_ids, finish_reason=finish,
                weight_version=as_str(require(meta, "weight_version", "meta_info"), "meta_info.weight_version"),
                prompt_tokens=as_int(require(meta, "prompt_tokens", "meta_info"), "meta_info.prompt_tokens"),
                completion_tokens=as_int(require(meta, "completion_tokens", "meta_info"),
                                         "meta_info.completion_tokens"),
                rid=opt_str(meta.get("id"), "meta_info.id"), text=opt_str(payload.get("text"), "text"),
                weight_versions=spans)
    if finish.is_abort:
        return GenerateResponse(**base)
    if base["completion_tokens"] != len(output_ids):
        raise ParseError(f"meta_info.completion_tokens = {base['completion_tokens']} but output_ids has "
                         f"{len(output_ids)} ids", field="meta_info.completion_tokens")
    if base["prompt_tokens"] != len(request.input_ids):
        raise ParseError(f"meta_info.prompt_tokens = {base['prompt_tokens']} but the request sent "
                         f"{len(request.input_ids)} input_ids", field="meta_info.prompt_tokens")
    logprobs = _parse_logprobs(meta, output_ids) if request.return_logprob else None
    routing = None
    if request.return_routed_experts:
        if num_moe_layers is None or topk is None:
            raise ParseError("parse_generate_response: routing was requested; pass num_moe_layers and "
                             "topk so the row shape can be checked", field="num_moe_layers")
        if meta.get("routed_experts") is None:
            raise MissingRoutingError(
                f"meta_info.routed_experts: absent for rid {meta.get('id')!r} although "
                "return_routed_experts=true; the rollout must abort (start SGLang with "
                "--enable-return-routed-experts)", field="meta_info.routed_experts", rid=meta.get("id"))
        routing = decode_routed_experts(meta["routed_experts"], num_moe_layers, topk,
                                        request.num_routing_rows(len(output_ids)),
                                        num_experts=num_experts, sample=str(meta.get("id")))
    return GenerateResponse(**base, output_token_logprobs=logprobs, routed_experts_RLK=routing)
