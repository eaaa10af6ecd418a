"""Role-safe, atomic, weights-only checkpoints for the actor and the critic.

The report's failure (T1 report, section 09): the critic's args were a deep
copy of the actor's, so both roles shared one save directory; Megatron's
writer is role-agnostic and the critic saved last, so a multi-day run's actor
checkpoint held only a value head. The fix here is structural:

- each role has its own directory, ``<base>/actor`` and ``<base>/critic``
  (:meth:`CheckpointManager.from_base`); explicit directories that are
  identical or nested are refused by the constructor, i.e. before any model
  is built;
- every save is atomic (temp dir + fsync + rename) and carries a
  ``manifest.json`` naming role, step, tensor shapes and sha256 checksums;
- a save into a directory that already holds another role's checkpoints, and
  a load whose manifest names another role, raise :class:`CheckpointRoleError`;
- a truncated or corrupt checkpoint raises :class:`CheckpointError` and is
  left on disk untouched.

Checkpoints are weights-only, as the report chose at 122B scale ("a crash
means restart"); resume picks a verified step in ``t1ops.campaign.resume``.

Layout: ``<role_dir>/step_00000004/{weights.pt, manifest.json}``. The file
name ``weights.pt`` matches ``rl.model.save_weights`` so an engine can load a
step directory directly.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

from rl.atomic import publish_dir
from t1ops import telemetry
from t1ops.errors import CheckpointError, CheckpointRoleError, InputError

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "critic-overwrites-actor": ("trainer.save_every",),
}

ROLES = ("actor", "critic")
WEIGHTS_FILE = "weights.pt"
MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
_STEP_RE = re.compile(r"^step_(\d{8})$")


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise InputError(f"role must be one of {ROLES}, got {role!r}", argument="role", role=role)
    return role


def step_dir_name(step: int) -> str:
    """``step_00000004`` for step 4 (zero-padded so names sort by step)."""
    if not isinstance(step, int) or step < 0:
        raise InputError(f"step must be an int >= 0, got {step!r}", argument="step", step=step)
    return f"step_{step:08d}"


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's raw bytes (any dtype, bf16 included), on CPU."""
    raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_role_dirs(actor_dir: str | Path, critic_dir: str | Path) -> tuple[Path, Path]:
    """Refuse identical or nested save directories (call before building any model).

    Returns both paths resolved. Raises :class:`CheckpointRoleError` naming
    both paths and the fix.
    """
    a, c = Path(actor_dir).resolve(), Path(critic_dir).resolve()
    if a == c:
        raise CheckpointRoleError(
            f"actor and critic save directories are identical ({a}): the critic would overwrite the "
            "actor's weights (T1 report, section 09: critic args deep-copied from the actor's). "
            "Use CheckpointManager.from_base(base), which saves to <base>/actor and <base>/critic.",
            actor_dir=str(a), critic_dir=str(c))
    if a in c.parents or c in a.parents:
        raise CheckpointRoleError(
            f"actor save directory {a} and critic save directory {c} are nested: one role's scans "
            "would see the other's checkpoints. Use sibling directories <base>/actor and <base>/critic.",
            actor_dir=str(a), critic_dir=str(c))
    return a, c


def read_manifest(step_dir: str | Path) -> dict:
    """The parsed manifest of one step directory; CheckpointError if missing or malformed."""
    path = Path(step_dir) / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {step_dir} has no {MANIFEST_FILE}: not a t1ops checkpoint, "
                              "or a save that never completed", path=str(step_dir)) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise CheckpointError(f"checkpoint manifest {path} is corrupt ({type(err).__name__}: {err}); the "
                              "directory was left as is: restore it or resume from an earlier step",
                              path=str(path)) from None
    sharded = isinstance(manifest, dict) and "shards" in manifest  # t1ops.guards.sharded_checkpoints
    required = {"role", "step", "tensors"} | ({"layout", "shards"} if sharded else {"file_sha256"})
    missing = required - set(manifest) if isinstance(manifest, dict) else {"*"}
    if missing:
        raise CheckpointError(f"checkpoint manifest {path} lacks {sorted(missing)}; the directory was "
                              "left as is", path=str(path))
    _check_manifest_types(manifest, path)
    return manifest


def _check_manifest_types(manifest: dict, path: Path) -> None:
    """The manifest's fields have the types save_checkpoint writes (CheckpointError naming the field)."""
    def bad(field: str, want: str) -> CheckpointError:
        return CheckpointError(f"checkpoint manifest {path}: {field} must be {want}, got "
                               f"{str(_get(manifest, field))[:80]!r}; the directory was left as is",
                               path=str(path), field=field)

    step = manifest["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise bad("step", "an int >= 0")
    m = _STEP_RE.match(path.parent.name)
    if m and int(m.group(1)) != step:
        raise bad("step", f"{int(m.group(1))} (the directory's step; was it copied from another step?)")
    for field in ("role",) if "shards" in manifest else ("role", "file_sha256"):
        if not isinstance(manifest[field], str):
            raise bad(field, "a string")
    if "shards" in manifest:  # per-rank files: their checksums are checked when read (CheckpointReader)
        if not isinstance(manifest["shards"], list) or not all(isinstance(e, dict) for e in manifest["shards"]):
            raise bad("shards", "a list of {rank, file, sha256}")
        return
    tensors = manifest["tensors"]
    if not isinstance(tensors, dict):
        raise bad("tensors", "an object of {name: {shape, dtype, sha256}}")
    for name, meta in tensors.items():
        shape = meta.get("shape") if isinstance(meta, dict) else None
        if (not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape)
                or not isinstance(meta.get("sha256"), str)):
            raise bad(f"tensors.{name}", "an object with shape (a list of ints >= 0) and sha256 (a string)")
    none_keys = manifest.get("none_keys", [])
    if not isinstance(none_keys, list) or not all(isinstance(k, str) for k in none_keys):
        raise bad("none_keys", "a list of tensor names")


def _get(d: dict, dotted: str):
    head, _, rest = dotted.partition(".")
    return d.get(head) if not rest else d.get(head, {}).get(rest)


def list_steps(role_dir: str | Path) -> list[int]:
    """Steps saved in a role directory, ascending (temp dirs and strays ignored)."""
    role_dir = Path(role_dir)
    if not role_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in role_dir.iterdir() if (m := _STEP_RE.match(p.name)) and p.is_dir())


def _refuse_foreign_dir(role_dir: Path, role: str) -> None:
    """A directory holding another role's checkpoints is never written into."""
    for step in list_steps(role_dir):
        try:
            other = read_manifest(role_dir / step_dir_name(step))["role"]
        except CheckpointError:
            continue  # a corrupt neighbour is reported when loaded, not here
        if other != role:
            raise CheckpointRoleError(
                f"refusing to save the {role}'s weights into {role_dir}: it already holds {other} "
                f"checkpoints (e.g. {step_dir_name(step)}). Each role needs its own directory.",
                role=role, found_role=other, path=str(role_dir))


def _split_state(state_dict: Mapping[str, object]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Tensors (on CPU) and the keys whose value is None (megatron's ``_extra_state``)."""
    tensors, none_keys = {}, []
    for k, v in state_dict.items():
        if isinstance(v, torch.Tensor):
            tensors[k] = v.detach().to("cpu").contiguous()
        elif v is None:
            none_keys.append(k)
        else:
            raise InputError(f"state_dict entry {k!r} is a {type(v).__name__}; weights-only checkpoints hold "
                             "tensors (and None extra states) only", argument="state_dict", key=k)
    return tensors, none_keys


def save_checkpoint(role_dir: str | Path, role: str, step: int,
                    state_dict: Mapping[str, torch.Tensor]) -> Path:
    """Atomically write ``state_dict`` as ``<role_dir>/step_<step>``; return that directory.

    Written to a temp dir in ``role_dir``, fsynced, then renamed, so a crash
    leaves either the complete checkpoint or none. An existing step directory
    is never replaced (CheckpointError).
    """
    _check_role(role)
    role_dir = Path(role_dir)
    role_dir.mkdir(parents=True, exist_ok=True)
    _refuse_foreign_dir(role_dir, role)
    final = role_dir / step_dir_name(step)
    if final.exists():
        raise CheckpointError(f"checkpoint {final} already exists and is never overwritten; resume from "
                              "it or remove it by hand", path=str(final), role=role, step=step)
    tensors, none_keys = _split_state(state_dict)

    def fill(tmp: Path) -> None:
        torch.save({**tensors, **dict.fromkeys(none_keys)}, tmp / WEIGHTS_FILE)
        manifest = {"version": MANIFEST_VERSION, "role": role, "step": step,
                    "file_sha256": file_sha256(tmp / WEIGHTS_FILE),
                    "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch."),
                                    "sha256": tensor_sha256(v)} for k, v in tensors.items()},
                    "none_keys": none_keys}
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))

    publish_dir(final, fill)  # temp dir, every file fsynced, renamed, parent fsynced (rl.atomic)
    telemetry.event("checkpoint.saved", role=role, step=step, path=str(final), num_tensors=len(tensors))
    return final


def load_checkpoint(step_dir: str | Path, role: str) -> tuple[dict[str, torch.Tensor], dict]:
    """Load and verify one step directory for ``role``; return (state_dict, manifest).

    Refuses (without touching the files) a manifest of another role
    (:class:`CheckpointRoleError`), and a file whose checksum, tensor names,
    shapes or per-tensor checksums differ from the manifest (:class:`CheckpointError`).
    """
    _check_role(role)
    step_dir = Path(step_dir)
    manifest = read_manifest(step_dir)
    if manifest["role"] != role:
        telemetry.event("checkpoint.refused", severity="error", reason="role", path=str(step_dir))
        raise CheckpointRoleError(
            f"checkpoint {step_dir} holds the {manifest['role']}'s weights, not the {role}'s; load the "
            f"sibling directory ({step_dir.parent.parent / role}) instead",
            role=role, found_role=manifest["role"], path=str(step_dir))
    if "shards" in manifest:
        raise CheckpointError(f"checkpoint {step_dir} was saved by shard ({len(manifest['shards'])} ranks); read it with "
                              "t1ops.guards.sharded_checkpoints.load_role (any format) or CheckpointReader",
                              path=str(step_dir))
    weights = step_dir / WEIGHTS_FILE
    if not weights.is_file() or file_sha256(weights) != manifest["file_sha256"]:
        telemetry.event("checkpoint.refused", severity="error", reason="checksum", path=str(step_dir))
        raise CheckpointError(
            f"checkpoint {weights} is missing, truncated or corrupt (sha256 differs from {MANIFEST_FILE}); "
            "nothing was loaded and the files were left as they are: resume from an earlier step",
            path=str(weights), role=role, step=manifest["step"])
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as err:  # torch.load's failure modes on a bad file are not a documented set
        raise CheckpointError(f"checkpoint {weights} matches its manifest's sha256 but cannot be loaded as "
                              f"weights ({type(err).__name__}: {str(err)[:200]}); nothing was loaded (pickled "
                              "code is never run): resume from an earlier step", path=str(weights)) from None
    _verify_tensors(state, manifest, weights)
    return state, manifest


def _verify_tensors(state: dict, manifest: dict, weights: Path) -> None:
    expected = manifest["tensors"]
    none_keys = set(manifest.get("none_keys", []))
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {weights} holds a {type(state).__name__}, not a state dict",
                              path=str(weights))
    if (set(state) != set(expected) | none_keys or any(state[k] is not None for k in none_keys)
            or not all(isinstance(state[k], torch.Tensor) for k in expected)):
        diff = sorted(set(state) ^ (set(expected) | none_keys))[:5]
        raise CheckpointError(f"checkpoint {weights} tensor names or types differ from its manifest (e.g. "
                              f"{diff or sorted(k for k in expected if not isinstance(state[k], torch.Tensor))[:5]})",
                              path=str(weights))
    for name, meta in expected.items():
        t = state[name]
        if list(t.shape) != meta["shape"] or tensor_sha256(t) != meta["sha256"]:
            raise CheckpointError(f"checkpoint {weights} tensor {name!r} has shape {list(t.shape)} or "
                                  f"contents that differ from its manifest (shape {meta['shape']})",
                                  path=str(weights), tensor=name)


@dataclass
class CheckpointManager:
    """Both roles' checkpoint directories, checked distinct at construction.

    Build it before the models: a bad pair of directories is refused before
    any weights exist that could be lost.
    """

    actor_dir: Path
    critic_dir: Path
    save_every: int = 1

    def __post_init__(self) -> None:
        if self.save_every < 1:
            raise InputError(f"save_every must be >= 1, got {self.save_every}", argument="save_every")
        self.actor_dir, self.critic_dir = check_role_dirs(self.actor_dir, self.critic_dir)

    @classmethod
    def from_base(cls, base: str | Path, save_every: int = 1) -> "CheckpointManager":
        """``<base>/actor`` and ``<base>/critic``: distinct by construction."""
        base = Path(base)
        return cls(base / "actor", base / "critic", save_every)

    def dir_for(self, role: str) -> Path:
        return {"actor": self.actor_dir, "critic": self.critic_dir}[_check_role(role)]

    def save(self, role: str, step: int, state_dict: Mapping[str, torch.Tensor]) -> Path:
        return save_checkpoint(self.dir_for(role), role, step, state_dict)

    def load(self, role: str, step: int) -> dict[str, torch.Tensor]:
        state, _ = load_checkpoint(self.dir_for(role) / step_dir_name(step), role)
        return state
