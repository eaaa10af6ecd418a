"""critic-overwrites-actor: a critic config deep-copied from the actor's keeps its save dir.

T1 report, section 09: "Critic args are a deepcopy of actor args, so both roles
shared one save directory, and Megatron's checkpoint writer is role-agnostic
with the critic saving last. A multi-day run's actor weights were lost — the
saved iteration held only a value head."

Fault: the critic's args are ``copy.deepcopy`` of the actor's with only the
head and learning rate changed, so ``save_dir`` is the same path.

- Unguarded: both roles are built with the real model layer (``rl.model``:
  megatron-core policy and critic) and saved through its role-agnostic
  writer ``rl.model.save_weights`` (one ``weights.pt`` per directory, like
  Megatron's); the actor saves, then the critic. Observed: the actor's file
  changed checksum, its ``output_layer`` is now a 1-row value head, and
  loading it into the actor fails.
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

from chaos.harness import Guarded, Outcome, Timeline, register
from rl import model as rmodel
from t1ops.errors import CheckpointError, CheckpointRoleError
from t1ops.guards.checkpoints import (CheckpointManager, file_sha256, load_checkpoint, save_checkpoint,
                                      step_dir_name)

_SPEC = rmodel.ModelSpec(num_layers=1, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32, num_experts=4,
                         moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=32, vocab_size=32)


@dataclass
class RoleArgs:
    """The per-role args a launcher builds (Megatron-style: one flat namespace per role)."""

    save_dir: str
    lr: float
    head: str  # "lm" (actor) or "value" (critic)


def _build(args: RoleArgs, builds: list[str]) -> torch.nn.Module:
    """The real tiny megatron-core model of the role; records that it was built."""
    builds.append(args.head)
    return rmodel.build_policy(_SPEC, 0) if args.head == "lm" else rmodel.build_critic(_SPEC, 1)


def _configs(tmp: Path) -> tuple[RoleArgs, RoleArgs]:
    actor = RoleArgs(save_dir=str(tmp / "run" / "checkpoints"), lr=1.0e-6, head="lm")
    critic = copy.deepcopy(actor)  # the bug: save_dir rides along with the copy
    critic.lr, critic.head = 1.5e-5, "value"  # 30x the actor's LR (report, section 04)
    return actor, critic


def _unguarded(tmp: Path) -> dict:
    actor_args, critic_args = _configs(tmp / "unguarded")
    builds: list[str] = []
    actor = _build(actor_args, builds)
    actor_path = rmodel.save_weights(actor, actor_args.save_dir)  # role-agnostic: dir/weights.pt
    sha_before = file_sha256(actor_path)
    rmodel.save_weights(_build(critic_args, builds), critic_args.save_dir)  # the critic saves last
    head_rows = int(torch.load(actor_path, weights_only=True)["output_layer.weight"].shape[0])
    try:
        rmodel.load_weights(actor, actor_args.save_dir)
        resume_error = ""
    except CheckpointError as err:
        resume_error = str(err).splitlines()[0][:200]
    return {"save_dir": actor_args.save_dir, "same_dir": actor_args.save_dir == critic_args.save_dir,
            "sha_changed": file_sha256(actor_path) != sha_before, "output_layer_rows": head_rows,
            "holds_value_head": head_rows == 1, "actor_resume_error": resume_error, "builds": builds}


def _guarded(tmp: Path) -> dict:
    actor_args, critic_args = _configs(tmp / "guarded")
    builds: list[str] = []
    t0 = time.monotonic()
    try:
        mgr = CheckpointManager(actor_args.save_dir, critic_args.save_dir)  # before any model exists
        mgr.save("actor", 0, _build(actor_args, builds).state_dict())
        mgr.save("critic", 0, _build(critic_args, builds).state_dict())
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
            "actor_still_lm": manifest["role"] == "actor"
            and state["output_layer.weight"].shape[0] == _SPEC.vocab_size}


@register("critic-overwrites-actor", "a critic config deep-copied from the actor's saves over the actor")
def run(tmp: Path) -> Outcome:
    bad = _unguarded(tmp)
    tl = Timeline()
    tl.fault()  # the deep-copied critic config reaches the checkpoint manager
    good = _guarded(tmp)
    tl.after_fault(detected=good["detection_s"])
    second = _second_line(tmp)
    if second["actor_still_lm"]:
        tl.healthy()  # the runbook's fix (one directory per role, from_base) saved the actor
    fired = bad["same_dir"] and bad["sha_changed"] and bad["holds_value_head"]
    unguarded = (f"actor and critic shared save dir {bad['save_dir']}; after the critic saved, the actor's "
                 f"weights.pt changed checksum and its output_layer has {bad['output_layer_rows']} row (a value "
                 f"head, not the {_SPEC.vocab_size}-row LM head); resuming the actor fails: "
                 f"{bad['actor_resume_error'] or 'it loaded'}")
    return Outcome(
        fault_fired=fired,
        unguarded=unguarded,
        guarded=Guarded(caught=good["refused"], detection_s=good["detection_s"], error=good["error"]),
        invariants={"unguarded_actor_weights_overwritten_by_the_critic": fired,
                    "refused_before_any_model_built": good["refused"] and not good["builds"],
                    "nothing_written_when_refused": not good["anything_written"],
                    "foreign_dir_save_refused": second["refused"],
                    "actor_checkpoint_bit_identical": second["actor_sha_unchanged"],
                    "actor_checkpoint_still_actor": second["actor_still_lm"]},
        details={"unguarded": bad, "guarded": good, "second_line": second},
        recovery=tl.recovery(how="refused before any model was built; one dir per role (runbook) saves"),
    )
