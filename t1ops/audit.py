"""Trajectory dumps and the TITO / R3 audit (T1 report, section 05).

Dump format (written by :func:`write_trajectory`, read by :func:`read_trajectory`)
------------------------------------------------------------------------------
A dump is a directory of ``*.npz`` files, one per trajectory chunk, named
``<sample_id>.c<chunk_id>.npz`` (numpy ``savez_compressed``; no pickles). Each
file holds equal-length arrays over the chunk's N positions:

==================  ===========  ==================================================
key                 dtype/shape  meaning
==================  ===========  ==================================================
tokens              int64 (N,)   the training stream
loss_mask           int8  (N,)   1 = sampled by the policy, 0 = prompt/observation
rollout_logprobs    float32 (N,) behaviour log-prob of each sampled token, else 0
engine_tokens       int64 (N,)   id the engine sampled / was fed at that position
origin              int8  (N,)   0 aligned, 1 retokenized, 2 placeholder
policy_version      int32 (N,)   weights version that sampled the token, -1 if none
routing             int32 (N,L,K) routed-expert rows; shape (0,) when R3 is off
meta                0-d str      JSON object, see below
==================  ===========  ==================================================

``meta`` keys: ``sample_id``, ``group_id``, ``prompt_id``, ``chunk_id``,
``num_chunks``, ``num_turns``, ``relations`` (one of strict / normalized /
retokenized / split per turn boundary), ``repairs`` (the normalized repairs),
and optionally ``reward``, ``reward_source``, ``timings``.

The audit reports, over all files: samples, routing rows, positions aligned /
retokenized / placeholder (%), drift inside the loss region (%, target 0),
the trajectory-level all-strict share, and per-relation counts. The report's
audited run: 1,402 samples, 27.25M routing rows, 97.39% aligned, 2.61%
retokenized or placeholder, 0.0000% drift in the loss region, all-strict False
on ~99.9% of trajectories.
"""
from __future__ import annotations

import json
import struct
import zipfile
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from rl.errors import ParseError
from rl.tito import RELATIONS, Trajectory
from t1ops.audit_npz import check_members
from t1ops.audit_shares import add as add_counts
from t1ops.audit_shares import counts as class_counts
from t1ops.audit_shares import shares

ARRAY_KEYS = ("tokens", "loss_mask", "rollout_logprobs", "engine_tokens", "origin",
              "policy_version", "routing")


def write_trajectory(traj: Trajectory, dump_dir: Path, **extra_meta) -> Path:
    """Write one chunk as ``<sample_id>.c<chunk_id>.npz``; ``extra_meta`` merges into meta."""
    dump_dir = Path(dump_dir)
    dump_dir.mkdir(parents=True, exist_ok=True)
    meta = {**traj.meta, **extra_meta}
    path = dump_dir / f"{meta.get('sample_id', 'sample')}.c{meta.get('chunk_id', 0)}.npz"
    routing = traj.routing if traj.routing is not None else np.zeros((0,), dtype=np.int32)
    np.savez_compressed(path, tokens=traj.tokens, loss_mask=traj.loss_mask,
                        rollout_logprobs=traj.rollout_logprobs, engine_tokens=traj.engine_tokens,
                        origin=traj.origin, policy_version=traj.policy_version, routing=routing,
                        meta=np.array(json.dumps(meta)))
    return path


#: What a corrupt, truncated or hostile npz raises from numpy, zipfile and zlib.
_CORRUPT = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError,
            struct.error)
#: dtype kinds each array may have (i/u: integers, b: bool, f: float).
_KINDS = {"tokens": "iu", "loss_mask": "iub", "rollout_logprobs": "f", "engine_tokens": "iu", "origin": "iu",
          "policy_version": "iu", "routing": "iu"}


def _load_members(path: Path) -> dict[str, np.ndarray]:
    """Every array and ``meta`` of a dump file, loaded without pickles; ParseError naming the member."""
    try:
        z = np.load(path, allow_pickle=False)
    except _CORRUPT as exc:
        raise ParseError(f"{path}: not a readable trajectory dump ({exc})", path=str(path)) from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ParseError(f"{path}: a single .npy array, not an npz trajectory dump; see t1ops/audit.py for "
                         "the format", path=str(path))
    with z:
        check_members(path, z.zip)   # shapes against the file's size, before any allocation (#51)
        missing = [k for k in ARRAY_KEYS + ("meta",) if k not in z.files]
        if missing:
            raise ParseError(f"{path}: dump file lacks {missing}; see t1ops/audit.py for the format",
                             path=str(path), missing=missing)
        members = {}
        for key in ARRAY_KEYS + ("meta",):
            try:
                members[key] = z[key]
            except _CORRUPT as exc:
                raise ParseError(f"{path}: member {key!r} is unreadable ({exc}); the file is corrupt or holds "
                                 "pickled objects, which are never loaded", path=str(path), key=key) from None
    return members


def _parse_meta(path: Path, meta: np.ndarray) -> dict:
    if meta.ndim != 0 or meta.dtype.kind != "U":
        raise ParseError(f"{path}: meta must be a 0-d JSON string, got dtype {meta.dtype} shape {meta.shape}",
                         path=str(path), key="meta")
    try:
        out = json.loads(str(meta))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ParseError(f"{path}: meta is not valid JSON ({exc})", path=str(path), key="meta") from None
    rels = out.get("relations", []) if isinstance(out, dict) else None
    if not isinstance(rels, list) or not all(isinstance(r, str) and r in RELATIONS for r in rels):
        raise ParseError(f"{path}: meta must be a JSON object whose 'relations' is a list of {RELATIONS}, "
                         f"got {str(meta)[:120]!r}", path=str(path), key="meta")
    return out


def read_trajectory(path: Path) -> Trajectory:
    """Read one dump file; a malformed file is a ParseError naming the file and the key.

    Every array must be 1-D of its documented dtype kind and as long as
    ``tokens`` (``routing``: (N, L, K), or shape (0,) without R3); ``meta``
    a JSON object. Pickled members are refused, never loaded.
    """
    arrays = _load_members(path)
    meta = _parse_meta(path, arrays.pop("meta"))
    for key, arr in arrays.items():
        no_r3 = key == "routing" and arr.shape == (0,)
        ndim = 3 if key == "routing" and not no_r3 else 1
        if arr.dtype.kind not in _KINDS[key] or arr.ndim != ndim:
            raise ParseError(f"{path}: {key} has dtype {arr.dtype} and shape {arr.shape}; expected a "
                             f"{ndim}-D array of dtype kind {_KINDS[key]!r}", path=str(path), key=key)
        n = arrays["tokens"].shape[0]
        if arr.shape[0] != n and not no_r3:
            raise ParseError(f"{path}: {key} has {arr.shape[0]} entries, tokens has {n}; "
                             "the arrays of a dump must be aligned", path=str(path), key=key)
    routing = arrays.pop("routing")
    return Trajectory(**arrays, routing=routing if routing.ndim == 3 else None, meta=meta)


@dataclass
class AuditReport:
    """Totals over a dump (positions are counted over all chunks)."""

    files: int = 0
    samples: int = 0
    routing_rows: int = 0
    positions: int = 0
    loss_positions: int = 0
    aligned: int = 0
    retokenized: int = 0
    placeholder: int = 0
    drift_in_loss: int = 0
    all_strict_samples: int = 0
    relations: dict[str, int] = field(default_factory=dict)
    token_classes: dict[str, int] = field(default_factory=dict)       # t1ops.audit_shares.CLASSES, whole run
    per_trial: dict[str, dict[str, int]] = field(default_factory=dict)  # the same per sample id
    engine: dict = field(default_factory=dict)  # drift against the engine's own record (t1ops.audit_engine)

    def pct(self, count: int, of: int | None = None) -> float:
        denom = self.positions if of is None else of
        return 100.0 * count / denom if denom else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        eng = self.engine or {}
        d.update(engine_drift_in_loss_pct=self.pct(eng.get("drift", 0), eng.get("loss_tokens", 0)),
                 aligned_pct=self.pct(self.aligned), retokenized_pct=self.pct(self.retokenized),
                 placeholder_pct=self.pct(self.placeholder),
                 drift_in_loss_pct=self.pct(self.drift_in_loss, self.loss_positions),
                 all_strict_share=self.all_strict_samples / self.samples if self.samples else 0.0,
                 shares=shares(self.token_classes),
                 per_trial_shares={k: {**v, **shares(v)} for k, v in self.per_trial.items()})
        return d


def audit_dump(dump_dir: Path, emissions: Path | None = None) -> AuditReport:
    """Read every ``*.npz`` in ``dump_dir`` and total the per-token accounting; the loss-region drift
    is measured against the engine's own record (``emissions``, else the run's ``emissions/``
    beside the dump; t1ops/audit_engine.py) when there is one."""
    from t1ops.audit_engine import engine_drift, find_record

    dump_dir = Path(dump_dir)
    if not dump_dir.is_dir():
        raise ParseError(f"{dump_dir}: not a directory of trajectory dumps", path=str(dump_dir))
    files = sorted(dump_dir.glob("*.npz"))
    if not files:
        raise ParseError(f"{dump_dir}: no *.npz trajectory files; see t1ops/audit.py for the format",
                         path=str(dump_dir))
    rep = AuditReport(files=len(files))
    relations: Counter[str] = Counter({r: 0 for r in RELATIONS})
    strict_by_sample: dict[str, bool] = {}
    checked = []
    for path in files:
        traj = read_trajectory(path)
        checked.append((f"{traj.meta.get('sample_id', path.stem)} c{traj.meta.get('chunk_id', 0)}", traj))
        acc = traj.accounting()
        for key in ("routing_rows", "positions", "loss_positions", "aligned", "retokenized",
                    "placeholder", "drift_in_loss"):
            setattr(rep, key, getattr(rep, key) + acc[key])
        rels = traj.meta.get("relations", [])
        relations.update(rels)
        sid = str(traj.meta.get("sample_id", path.stem))
        classes = class_counts(traj)
        add_counts(rep.token_classes, classes)
        add_counts(rep.per_trial.setdefault(sid, {}), classes)
        # trajectory-level flag: a conjunction over every turn of every chunk being strict
        strict_by_sample[sid] = strict_by_sample.get(sid, True) and all(r == "strict" for r in rels)
    rep.samples = len(strict_by_sample)
    rep.all_strict_samples = sum(strict_by_sample.values())
    rep.relations = dict(relations)
    rep.engine = asdict(engine_drift(checked, find_record(dump_dir, emissions)))
    return rep
