"""SGLang's control endpoints as typed requests and responses (client and embedded server).

Pause and continue generation, load weights from disk, relabel the weight version, abort
requests, read the model info. Field names follow ``sglang/srt/managers/io_struct.py``
(``PauseGenerationReqInput``, ``ContinueGenerationReqInput``, ``UpdateWeightFromDiskReqInput``,
``UpdateWeightVersionReqInput``, ``AbortReq``) of :data:`rl.engines.protocol.SGLANG_SCHEMA_VERSION`;
the endpoint paths are in :mod:`rl.engines.protocol`. Parsers refuse unknown fields and never
fill in a default for a missing required one (:mod:`rl.engines.wire`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rl.engines.wire import as_bool, as_count, as_obj, as_str, no_unknown, or_default, require
from rl.errors import ParseError

PauseMode = Literal["abort", "retract", "in_place"]


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
        d = as_obj(or_default(d, {}), "pause_generation")
        no_unknown(d, {"mode", "rid"}, "pause_generation")
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
        d = as_obj(or_default(d, {}), "continue_generation")
        no_unknown(d, {"torch_empty_cache", "rid"}, "continue_generation")
        return cls(torch_empty_cache=as_bool(d.get("torch_empty_cache", True),
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
        no_unknown(as_obj(d, w), {f for f in cls.__dataclass_fields__} | {"rid"}, w)
        ver, fmt = d.get("weight_version"), d.get("load_format")
        return cls(model_path=as_str(require(d, "model_path", w), f"{w}.model_path"),
                   weight_version=None if ver is None else as_str(ver, f"{w}.weight_version"),
                   load_format=None if fmt is None else as_str(fmt, f"{w}.load_format"),
                   abort_all_requests=as_bool(d.get("abort_all_requests", False), f"{w}.abort_all_requests"),
                   flush_cache=as_bool(d.get("flush_cache", True), f"{w}.flush_cache"))


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
        return cls(success=as_bool(require(d, "success", w), "success"),
                   message=as_str(require(d, "message", w), "message"),
                   num_paused_requests=as_count(d.get("num_paused_requests", 0), "num_paused_requests"))


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
        no_unknown(as_obj(d, w), {"new_version", "abort_all_requests", "rid"}, w)
        return cls(new_version=as_str(require(d, "new_version", w), f"{w}.new_version"),
                   abort_all_requests=as_bool(d.get("abort_all_requests", True), f"{w}.abort_all_requests"))


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
        d = as_obj(or_default(d, {}), "abort_request")
        no_unknown(d, {"rid", "abort_all", "finished_reason", "abort_message"}, "abort_request")
        return cls(rid=as_str(or_default(d.get("rid"), ""), "abort_request.rid"),
                   abort_all=as_bool(d.get("abort_all", False), "abort_request.abort_all"))


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
        return cls(weight_version=as_str(require(d, "weight_version", "model_info"), "model_info.weight_version"),
                   model_path=None if path is None else as_str(path, "model_info.model_path"))


def ok_status(status_code: int) -> bool:
    """``/health``, ``/health_generate``, ``/flush_cache`` answer by status code only (200 / 503 / 400)."""
    return status_code == 200
