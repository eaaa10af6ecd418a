"""critic-overwrites-actor: a critic config deep-copied from the actor's keeps its save dir.

T1 report, section 09: "Critic args are a deepcopy of actor args, so both roles
shared one save directory, and Megatron's checkpoint writer is role-agnostic
with the critic saving last. A multi-day run's actor weights were lost — the
saved iteration held only a value head."

Fault: the critic's args are ``copy.deepcopy`` of the actor's with only the
head and learning rate changed, so ``save_dir`` is the same path.

- Unguarded: both roles save through a role-agnostic writer (one
  ``weights.pt`` per directory, like Megatron's); the actor saves, then the
  critic. Observed: the actor's file checksum changed and the file now holds
  a value head and no LM head.
- Guarded: :class:`t1ops.guards.checkpoints.CheckpointManager` is built from
  the two configs *before* any model; it refuses the identical directories,
  so no model is built and nothing is written. A second line is also
  exercised: a save into a directory that holds the other role's manifests is
  refused, leaving the actor's checkpoint bit-identical.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from chaos.harness import Guarded, Outcome, register
from t1ops.errors import CheckpointRoleError
from t1ops.guards.checkpoints import (CheckpointManager, file_sha256, load_checkpoint, save_checkpoint,
                                      step_dir_name)

_VOCAB, _HIDDEN = 32, 16


@dataclass
class RoleArgs:
    """The per-role args a launcher builds (Megatron-style: one flat namespace per role)."""

    save_dir: str
    lr: float
    head: str  # "lm" (actor) or "value" (critic)


def _build(args: RoleArgs, builds: list[str]) -> torch.nn.Module:
    """A small stand-in with the two roles' distinguishing heads; records that it was built."""
    builds.append(args.head)
    torch.manual_seed(0 if args.head == "lm" else 1)
    out = _VOCAB if args.head == "lm" else 1
    return torch.nn.ModuleDict({"embedding": torch.nn.Embedding(_VOCAB, _HIDDEN),
                                f"{args.head}_head": torch.nn.Linear(_HIDDEN, out, bias=False)})


def _role_agnostic_save(model: torch.nn.Module, save_dir: str) -> Path:
    """What Megatron's writer does: the same file name whatever the role."""
    path = Path(save_dir) / "weights.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return path


def _configs(tmp: Path) -> tuple[RoleArgs, RoleArgs]:
    actor = RoleArgs(save_dir=str(tmp / "run" / "checkpoints"), lr=1.0e-6, head="lm")
    critic = copy.deepcopy(actor)  # the bug: save_dir rides along with the copy
    critic.lr, critic.head = 1.5e-5, "value"  # 30x the actor's LR (report, section 04)
    return actor, critic


def _unguarded(tmp: Path) -> dict:
    actor_args, critic_args = _configs(tmp / "unguarded")
    builds: list[str] = []
    actor_path = _role_agnostic_save(_build(actor_args, builds), actor_args.save_dir)
    sha_before = file_sha256(actor_path)
    _role_agnostic_save(_build(critic_args, builds), critic_args.save_dir)  # the critic saves last
    keys = sorted(torch.load(actor_path, weights_only=True))
    return {"save_dir": actor_args.save_dir, "same_dir": actor_args.save_dir == critic_args.save_dir, "sha_changed": file_sha256(actor_path) != sha_before,
            "actor_file_keys": keys, "holds_value_head": "value_head.weight" in keys,
            "lm_head_lost": "lm_head.weight" not in keys, "builds": builds}


def _guarded(tmp: Path) -> dict:
    actor_args, critic_args = _configs(tmp / "guarded")
    builds: list[str] = []
    t0 = time.monotonic()
    try:
        mgr = CheckpointManager(actor_args.save_dir, critic_args.save_dir)  # before any model exists
        mgr.maybe_save(0, _build(actor_args, builds).state_dict(), _build(critic_args, builds).state_dict())
        refused, error, detection_s = False, "", None
    except CheckpointRoleError as err:
        refused, error, detection_s = True, str(err), time.monotonic() - t0
    return {"refused": refused, "error": error, "detection_s": detection_s, "builds": builds,
            "anything_written": Path(actor_args.save_dir).exists()}


def _second_line(tmp: Path) -> dict:
    """Bypass the constructor: point the critic's save at the actor's role directory."""
    builds: list[str] = []
    actor_args, critic_args = _configs(tmp / "second")
    mgr = CheckpointManager.from_base(actor_args.save_dir)
    actor_step = mgr.save("actor", 1, _build(actor_args, builds).state_dict())
    sha = file_sha256(actor_step / "weights.pt")
    try:
        save_checkpoint(mgr.actor_dir, "critic", 1, _build(critic_args, builds).state_dict())
        refused = False
    except CheckpointRoleError:
        refused = True
    state, manifest = load_checkpoint(mgr.actor_dir / step_dir_name(1), "actor")
    return {"refused": refused, "actor_sha_unchanged": file_sha256(actor_step / "weights.pt") == sha,
            "actor_still_lm": manifest["role"] == "actor" and "lm_head.weight" in state}


@register("critic-overwrites-actor", "a critic config deep-copied from the actor's saves over the actor")
def run(tmp: Path) -> Outcome:
    bad = _unguarded(tmp)
    good = _guarded(tmp)
    second = _second_line(tmp)
    fired = bad["same_dir"] and bad["sha_changed"] and bad["holds_value_head"]
    unguarded = (f"actor and critic shared save dir {bad['save_dir']}; after the "
                 f"critic saved, the actor's weights.pt changed checksum and holds {bad['actor_file_keys']} "
                 "(a value head, no LM head): the actor's weights are lost")
    return Outcome(
        fault_fired=fired,
        unguarded=unguarded,
        guarded=Guarded(caught=good["refused"], detection_s=good["detection_s"], error=good["error"]),
        invariants={"refused_before_any_model_built": good["refused"] and not good["builds"],
                    "nothing_written_when_refused": not good["anything_written"],
                    "foreign_dir_save_refused": second["refused"],
                    "actor_checkpoint_bit_identical": second["actor_sha_unchanged"],
                    "actor_checkpoint_still_actor": second["actor_still_lm"]},
        details={"unguarded": bad, "guarded": good, "second_line": second},
    )
