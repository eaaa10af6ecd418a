"""SGLang's distributed weight-update endpoints as typed requests (client and embedded server).

Field names, defaults and endpoint paths follow ``sglang/srt/managers/io_struct.py`` and
``sglang/srt/entrypoints/http_server.py`` of :data:`rl.engines.protocol.SGLANG_SCHEMA_VERSION`:
``InitWeightsUpdateGroupReqInput``, ``UpdateWeightsFromDistributedReqInput``,
``DestroyWeightsUpdateGroupReqInput``; each answers ``{"success", "message"}`` with HTTP 200,
or 400 when ``success`` is false. ``tests/rl/test_sglang_schema.py`` checks the payloads
against the io_struct classes of the real wheel when it is available.

A delta update (``rl.weights.delta``) is the same request with two t1ops fields, sent only when
set (so a full update's payload is SGLang's exactly): ``delta_base``, the version the delta
applies to, and ``delta_kinds``, one of ``dense`` / ``index`` / ``value`` per announced tensor.
A stock SGLang server does not take them; only embedded engines receive deltas (docs/weights.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rl.engines.wire import as_bool, as_int, as_obj, as_str, no_unknown, require
from rl.errors import ParseError

INIT_WEIGHTS_UPDATE_GROUP = "/init_weights_update_group"
UPDATE_WEIGHTS_FROM_DISTRIBUTED = "/update_weights_from_distributed"
DESTROY_WEIGHTS_UPDATE_GROUP = "/destroy_weights_update_group"
DEFAULT_GROUP = "weight_update_group"


@dataclass(frozen=True)
class InitWeightsUpdateGroupRequest:
    """``POST /init_weights_update_group``: join the trainer's group as rank ``rank_offset + tp_rank``."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = DEFAULT_GROUP
    backend: Literal["nccl", "gloo"] = "nccl"

    def __post_init__(self) -> None:
        if not 1 <= self.rank_offset < self.world_size:
            raise ParseError(f"init_weights_update_group: rank_offset {self.rank_offset} outside [1, "
                             f"{self.world_size}) (rank 0 is the trainer)", field="rank_offset")
        if not 0 < self.master_port < 65536:
            raise ParseError(f"init_weights_update_group: master_port {self.master_port} is not a port",
                             field="master_port")

    def to_json(self) -> dict[str, Any]:
        return {"master_address": self.master_address, "master_port": self.master_port,
                "rank_offset": self.rank_offset, "world_size": self.world_size, "group_name": self.group_name,
                "backend": self.backend}

    @classmethod
    def from_json(cls, d: Any) -> "InitWeightsUpdateGroupRequest":
        w = "init_weights_update_group"
        no_unknown(as_obj(d, w), set(cls.__dataclass_fields__) | {"rid"}, w)
        backend = d.get("backend", "nccl")
        if backend not in ("nccl", "gloo"):
            raise ParseError(f"{w}.backend: {backend!r} is not nccl/gloo", field=f"{w}.backend")
        return cls(master_address=as_str(require(d, "master_address", w), f"{w}.master_address"),
                   master_port=as_int(require(d, "master_port", w), f"{w}.master_port"),
                   rank_offset=as_int(require(d, "rank_offset", w), f"{w}.rank_offset"),
                   world_size=as_int(require(d, "world_size", w), f"{w}.world_size"),
                   group_name=as_str(d.get("group_name", DEFAULT_GROUP), f"{w}.group_name"), backend=backend)


@dataclass(frozen=True)
class UpdateWeightsFromDistributedRequest:
    """``POST /update_weights_from_distributed``: receive one broadcast per name (Hugging Face names);
    with ``delta_base`` a delta against that version (module docstring)."""

    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    group_name: str = DEFAULT_GROUP
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    delta_base: str | None = None
    delta_kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        w = "update_weights_from_distributed"
        if not self.names or not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ParseError(f"{w}: names ({len(self.names)}), dtypes ({len(self.dtypes)}) and shapes "
                             f"({len(self.shapes)}) must be equally long and non-empty", field="names")
        if (self.delta_base is None) != (not self.delta_kinds):
            raise ParseError(f"{w}: delta_base and delta_kinds come together (a delta) or not at all",
                             field="delta_kinds")
        bad = sorted(set(self.delta_kinds) - {"dense", "index", "value"})
        if self.delta_kinds and (len(self.delta_kinds) != len(self.names) or bad):
            raise ParseError(f"{w}: delta_kinds needs one of dense/index/value per name ({len(self.names)}), got "
                             f"{len(self.delta_kinds)}{f' with {bad}' if bad else ''}", field="delta_kinds")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"names": list(self.names), "dtypes": list(self.dtypes),
                             "shapes": [list(s) for s in self.shapes], "group_name": self.group_name,
                             "flush_cache": self.flush_cache, "abort_all_requests": self.abort_all_requests}
        if self.weight_version is not None:
            d["weight_version"] = self.weight_version
        if self.delta_base is not None:
            d["delta_base"], d["delta_kinds"] = self.delta_base, list(self.delta_kinds)
        return d

    @classmethod
    def from_json(cls, d: Any) -> "UpdateWeightsFromDistributedRequest":
        w = "update_weights_from_distributed"
        no_unknown(as_obj(d, w), set(cls.__dataclass_fields__) | {"rid", "load_format", "selector",
                                                                  "torch_empty_cache"}, w)
        if d.get("load_format") is not None:
            raise ParseError(f"{w}.load_format: {d['load_format']!r} is not supported (per-tensor broadcasts only)",
                             field=f"{w}.load_format")
        names, dtypes, shapes = (require(d, k, w) for k in ("names", "dtypes", "shapes"))
        if not all(isinstance(x, list) for x in (names, dtypes, shapes)):
            raise ParseError(f"{w}: names, dtypes and shapes must be lists", field=w)
        version, base, kinds = d.get("weight_version"), d.get("delta_base"), d.get("delta_kinds") or []
        if not isinstance(kinds, list):
            raise ParseError(f"{w}.delta_kinds must be a list", field=f"{w}.delta_kinds")
        return cls(names=tuple(as_str(n, f"{w}.names[{i}]") for i, n in enumerate(names)),
                   dtypes=tuple(as_str(t, f"{w}.dtypes[{i}]") for i, t in enumerate(dtypes)),
                   shapes=tuple(_shape(s, f"{w}.shapes[{i}]") for i, s in enumerate(shapes)),
                   group_name=as_str(d.get("group_name", DEFAULT_GROUP), f"{w}.group_name"),
                   flush_cache=as_bool(d.get("flush_cache", True), f"{w}.flush_cache"),
                   abort_all_requests=as_bool(d.get("abort_all_requests", False), f"{w}.abort_all_requests"),
                   weight_version=None if version is None else as_str(version, f"{w}.weight_version"),
                   delta_base=None if base is None else as_str(base, f"{w}.delta_base"),
                   delta_kinds=tuple(as_str(k, f"{w}.delta_kinds[{i}]") for i, k in enumerate(kinds)))


def _shape(v: Any, name: str) -> tuple[int, ...]:
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v):
        raise ParseError(f"{name}: expected a list of dimension sizes >= 0, got {v!r}", field=name)
    return tuple(v)


@dataclass(frozen=True)
class DestroyWeightsUpdateGroupRequest:
    """``POST /destroy_weights_update_group``."""

    group_name: str = DEFAULT_GROUP

    def to_json(self) -> dict[str, Any]:
        return {"group_name": self.group_name}

    @classmethod
    def from_json(cls, d: Any) -> "DestroyWeightsUpdateGroupRequest":
        w = "destroy_weights_update_group"
        no_unknown(as_obj(d, w), {"group_name", "rid"}, w)
        return cls(group_name=as_str(d.get("group_name", DEFAULT_GROUP), f"{w}.group_name"))


@dataclass(frozen=True)
class WeightsResponse:
    """``{"success": bool, "message": str}`` (``*ReqOutput`` of the three endpoints)."""

    success: bool
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"success": self.success, "message": self.message}

    @classmethod
    def from_json(cls, d: Any) -> "WeightsResponse":
        w = "weights response"
        return cls(success=as_bool(require(d, "success", w), "success"), message=as_str(require(d, "message", w), "message"))
