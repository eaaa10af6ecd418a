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

from rl.errors import MissingRoutingError, ParseError
from rl.routing import decode_routed_experts, encode_routed_experts, expected_num_rows

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

PauseMode = Literal["abort", "retract", "in_place"]
FinishType = Literal["stop", "length", "abort"]


# --- small strict readers -------------------------------------------------------
def _req(d: Any, key: str, where: str) -> Any:
    if not isinstance(d, dict):
        raise ParseError(f"{where}: expected a JSON object, got {type(d).__name__}", field=where)
    if key not in d:
        raise ParseError(f"{where}: missing field {key!r} (present: {sorted(d)})",
                         field=f"{where}.{key}")
    return d[key]


def _int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ParseError(f"{name}: expected an integer, got {v!r}", field=name)
    return v


def _count(v: Any, name: str) -> int:
    if _int(v, name) < 0:
        raise ParseError(f"{name}: expected a count >= 0, got {v!r}", field=name)
    return v


def _bool(v: Any, name: str) -> bool:
    if not isinstance(v, bool):
        raise ParseError(f"{name}: expected true/false, got {v!r}", field=name)
    return v


def _num(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ParseError(f"{name}: expected a finite number, got {v!r}", field=name)
    return float(v)


def _str(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise ParseError(f"{name}: expected a string, got {v!r}", field=name)
    return v


def _ids(v: Any, name: str) -> tuple[int, ...]:
    if not isinstance(v, list):
        raise ParseError(f"{name}: expected a list of token ids, got {type(v).__name__}", field=name)
    for i, t in enumerate(v):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ParseError(f"{name}[{i}]: expected a non-negative token id, got {t!r}", field=name,
                             index=i)
    return tuple(v)


def _or(v: Any, default: Any) -> Any:
    """``default`` for a JSON null only: a falsy value of the wrong type (0, "", false) stays an error."""
    return default if v is None else v


def _obj(d: Any, where: str) -> dict:
    if not isinstance(d, dict):
        raise ParseError(f"{where}: expected a JSON object, got {type(d).__name__}", field=where)
    return d


def _no_unknown(d: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ParseError(f"{where}: unsupported field(s) {unknown}; supported: {sorted(allowed)}",
                         field=where, unknown=unknown)


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
        _no_unknown(_obj(d, w), {f for f in cls.__dataclass_fields__}, w)
        seed = d.get("sampling_seed")
        return cls(
            max_new_tokens=_int(_req(d, "max_new_tokens", w), f"{w}.max_new_tokens"),
            temperature=_num(d.get("temperature", 1.0), f"{w}.temperature"),
            top_p=_num(d.get("top_p", 1.0), f"{w}.top_p"),
            top_k=_int(d.get("top_k", -1), f"{w}.top_k"),
            stop_token_ids=_ids(_or(d.get("stop_token_ids"), []), f"{w}.stop_token_ids"),
            ignore_eos=_bool(d.get("ignore_eos", False), f"{w}.ignore_eos"),
            sampling_seed=None if seed is None else _int(seed, f"{w}.sampling_seed"),
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
        _no_unknown(_obj(d, w), {
            "input_ids", "sampling_params", "return_logprob", "return_routed_experts",
            "routed_experts_start_len", "rid", "stream"}, w)
        if d.get("stream", False):
            raise ParseError("generate.stream: streaming is not supported; send stream=false",
                             field="generate.stream")
        rid = d.get("rid")
        return cls(
            input_ids=_ids(_req(d, "input_ids", w), "input_ids"),
            sampling_params=SamplingParams.from_json(_req(d, "sampling_params", w)),
            return_logprob=_bool(d.get("return_logprob", False), "return_logprob"),
            return_routed_experts=_bool(d.get("return_routed_experts", False), "return_routed_experts"),
            routed_experts_start_len=_int(d.get("routed_experts_start_len", 0), "routed_experts_start_len"),
            rid=None if rid is None else _str(rid, "rid"),
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
        kind = _req(d, "type", w)
        if kind not in ("stop", "length", "abort"):
            raise ParseError(f"{w}.type: {kind!r} is not one of stop/length/abort", field=f"{w}.type")
        status, matched = d.get("status_code"), d.get("matched")
        if isinstance(matched, bool) or not isinstance(matched, (int, str, type(None))):
            raise ParseError(f"{w}.matched: expected a token id, a stop string or null, got {matched!r}",
                             field=f"{w}.matched")
        return cls(type=kind, matched=matched,
                   length=None if d.get("length") is None else _int(d["length"], f"{w}.length"),
                   message=None if d.get("message") is None else _str(d["message"], f"{w}.message"),
                   status_code=None if status is None else _int(status, f"{w}.status_code"))


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
    rows = _req(meta, "output_token_logprobs", "meta_info")
    if not isinstance(rows, list) or len(rows) != len(output_ids):
        n = len(rows) if isinstance(rows, list) else type(rows).__name__
        raise ParseError(f"{name}: {n} entries for {len(output_ids)} output ids (must be one per token)",
                         field=name, num_output_ids=len(output_ids))
    out = []
    for i, (row, tok) in enumerate(zip(rows, output_ids)):
        if not isinstance(row, (list, tuple)) or len(row) < 2:
            raise ParseError(f"{name}[{i}]: expected [logprob, token_id, text], got {row!r}", field=name,
                             index=i)
        lp = _num(row[0], f"{name}[{i}][0]")
        if lp > 0:
            raise ParseError(f"{name}[{i}][0]: log-prob {lp} > 0", field=name, index=i)
        if _int(row[1], f"{name}[{i}][1]") != tok:
            raise ParseError(f"{name}[{i}]: token id {row[1]} differs from output_ids[{i}] = {tok}",
                             field=name, index=i)
        out.append(lp)
    return tuple(out)


def _opt_str(v: Any, name: str) -> str | None:
    return None if v is None else _str(v, name)


def _parse_spans(spans: Any, num_output: int) -> tuple[WeightVersionSpan, ...]:
    w = "meta_info.weight_versions"
    if spans is None:
        return ()
    if not isinstance(spans, list):
        raise ParseError(f"{w}: expected a list of {{version, start, end}} objects, got {type(spans).__name__}",
                         field=w)
    out = tuple(WeightVersionSpan(version=_str(_req(s, "version", f"{w}[{i}]"), f"{w}[{i}].version"),
                                  start=_int(_req(s, "start", f"{w}[{i}]"), f"{w}[{i}].start"),
                                  end=_int(_req(s, "end", f"{w}[{i}]"), f"{w}[{i}].end"))
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
    meta = _req(payload, "meta_info", "response")
    output_ids = _ids(_req(payload, "output_ids", "response"), "output_ids")
    finish = FinishReason.from_json(_req(meta, "finish_reason", "meta_info"))
    spans = _parse_spans(meta.get("weight_versions"), len(output_ids))
    base = dict(output_ids=output_ids, finish_reason=finish,
                weight_version=_str(_req(meta, "weight_version", "meta_info"), "meta_info.weight_version"),
                prompt_tokens=_int(_req(meta, "prompt_tokens", "meta_info"), "meta_info.prompt_tokens"),
                completion_tokens=_int(_req(meta, "completion_tokens", "meta_info"),
                                       "meta_info.completion_tokens"),
                rid=_opt_str(meta.get("id"), "meta_info.id"), text=_opt_str(payload.get("text"), "text"),
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


# --- control endpoints ---------------------------------------------------------------
@dataclass(frozen=True)
class PauseGenerationRequest:
    """``POST /pause_generation`` (``PauseGenerationReqInput``).

    ``abort``: in-flight requests return with finish_reason abort (callers
    resubmit); ``retract``: back to the waiting queue, KV recomputed later;
    ``in_place``: frozen with their KV. Only ``abort`` guarantees that no
    request spans two weight versions.
    """

    mode: PauseMode = "abort"

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode}

    @classmethod
    def from_json(cls, d: Any) -> "PauseGenerationRequest":
        d = _obj(_or(d, {}), "pause_generation")
        _no_unknown(d, {"mode", "rid"}, "pause_generation")
        mode = d.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            raise ParseError(f"pause_generation.mode: {mode!r} is not abort/retract/in_place",
                             field="pause_generation.mode")
        return cls(mode=mode)


@dataclass(frozen=True)
class ContinueGenerationRequest:
    """``POST /continue_generation`` (``ContinueGenerationReqInput``)."""

    torch_empty_cache: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"torch_empty_cache": self.torch_empty_cache}

    @classmethod
    def from_json(cls, d: Any) -> "ContinueGenerationRequest":
        d = _obj(_or(d, {}), "continue_generation")
        _no_unknown(d, {"torch_empty_cache", "rid"}, "continue_generation")
        return cls(torch_empty_cache=_bool(d.get("torch_empty_cache", True),
                                           "continue_generation.torch_empty_cache"))


@dataclass(frozen=True)
class UpdateWeightsFromDiskRequest:
    """``POST /update_weights_from_disk`` (``UpdateWeightFromDiskReqInput``).

    ``model_path`` is the checkpoint directory; ``weight_version`` becomes the
    version every later response reports.
    """

    model_path: str
    weight_version: str | None = None
    load_format: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model_path": self.model_path, "abort_all_requests": self.abort_all_requests,
                             "flush_cache": self.flush_cache}
        if self.weight_version is not None:
            d["weight_version"] = self.weight_version
        if self.load_format is not None:
            d["load_format"] = self.load_format
        return d

    @classmethod
    def from_json(cls, d: Any) -> "UpdateWeightsFromDiskRequest":
        w = "update_weights_from_disk"
        _no_unknown(_obj(d, w), {f for f in cls.__dataclass_fields__} | {"rid"}, w)
        ver, fmt = d.get("weight_version"), d.get("load_format")
        return cls(model_path=_str(_req(d, "model_path", w), f"{w}.model_path"),
                   weight_version=None if ver is None else _str(ver, f"{w}.weight_version"),
                   load_format=None if fmt is None else _str(fmt, f"{w}.load_format"),
                   abort_all_requests=_bool(d.get("abort_all_requests", False), f"{w}.abort_all_requests"),
                   flush_cache=_bool(d.get("flush_cache", True), f"{w}.flush_cache"))


@dataclass(frozen=True)
class UpdateWeightsFromDiskResponse:
    """``UpdateWeightFromDiskReqOutput``; HTTP 200 on success, 400 otherwise."""

    success: bool
    message: str
    num_paused_requests: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"success": self.success, "message": self.message,
                "num_paused_requests": self.num_paused_requests}

    @classmethod
    def from_json(cls, d: Any) -> "UpdateWeightsFromDiskResponse":
        w = "update_weights_from_disk response"
        return cls(success=_bool(_req(d, "success", w), "success"),
                   message=_str(_req(d, "message", w), "message"),
                   num_paused_requests=_count(d.get("num_paused_requests", 0), "num_paused_requests"))


@dataclass(frozen=True)
class UpdateWeightVersionRequest:
    """``POST /update_weight_version`` (``UpdateWeightVersionReqInput``): relabel without new weights."""

    new_version: str
    abort_all_requests: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"new_version": self.new_version, "abort_all_requests": self.abort_all_requests}

    @classmethod
    def from_json(cls, d: Any) -> "UpdateWeightVersionRequest":
        w = "update_weight_version"
        _no_unknown(_obj(d, w), {"new_version", "abort_all_requests", "rid"}, w)
        return cls(new_version=_str(_req(d, "new_version", w), f"{w}.new_version"),
                   abort_all_requests=_bool(d.get("abort_all_requests", True), f"{w}.abort_all_requests"))


@dataclass(frozen=True)
class AbortRequest:
    """``POST /abort_request`` (``AbortReq``): one ``rid``, or every request with ``abort_all``."""

    rid: str = ""
    abort_all: bool = False

    def __post_init__(self) -> None:
        if not self.rid and not self.abort_all:
            raise ParseError("abort_request: give a rid or abort_all=true (SGLang ignores neither)",
                             field="abort_request.rid")

    def to_json(self) -> dict[str, Any]:
        return {"rid": self.rid, "abort_all": self.abort_all}

    @classmethod
    def from_json(cls, d: Any) -> "AbortRequest":
        d = _obj(_or(d, {}), "abort_request")
        _no_unknown(d, {"rid", "abort_all", "finished_reason", "abort_message"}, "abort_request")
        return cls(rid=_str(_or(d.get("rid"), ""), "abort_request.rid"),
                   abort_all=_bool(d.get("abort_all", False), "abort_request.abort_all"))


@dataclass(frozen=True)
class ModelInfo:
    """``GET /model_info``: where a client reads the engine's current ``weight_version``."""

    weight_version: str
    model_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"weight_version": self.weight_version, "model_path": self.model_path}

    @classmethod
    def from_json(cls, d: Any) -> "ModelInfo":
        path = d.get("model_path") if isinstance(d, dict) else None
        return cls(weight_version=_str(_req(d, "weight_version", "model_info"), "model_info.weight_version"),
                   model_path=None if path is None else _str(path, "model_info.model_path"))


def ok_status(status_code: int) -> bool:
    """``/health``, ``/health_generate``, ``/flush_cache`` answer by status code only (200 / 503 / 400)."""
    return status_code == 200
