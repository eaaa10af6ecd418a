"""Resume a campaign after the coordinator died (`t1ops run CONFIG --resume RUN_DIR`).

What a resume needs at step S, all verified before any role starts
(docs/campaign.md, "Resume"):

- the actor's and (PPO) the critic's weights at S (``checkpoints/{actor,critic}/step_S``,
  checksummed manifests: whole, ``t1ops.guards.checkpoints``, or one file per rank,
  ``t1ops.guards.sharded_checkpoints``);
- the trainer state at S (``checkpoints/trainer_state/step_S/state.pt``): both
  optimizers' state, the trainer's step count and RNG states, and the
  data-sampler position (the next step; task order is a pure function of seed
  and step, ``t1ops.campaign.worker.plan_groups``), written atomically with a
  sha256 manifest next to the critic every ``trainer.save_every`` steps;
- the behaviour snapshot of the next batch: the actor weights published as
  version S, which are the actor checkpoint at S itself;
- summary.json's rows up to S (rows after S describe steps that are run again).

S is the newest step at which all of them exist and verify. A run whose
actor reaches step 7 while its critic reaches step 4 resumes from 4 and says
so. Everything a crashed run wrote after S (checkpoints, trajectory dumps,
summary rows) is moved to ``superseded/<timestamp>/``, never deleted, so the
steps after S are run once more and no step appears twice.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rl.atomic import publish_dir, publish_file
from t1ops.campaign.reshard import ROLES, param_layout, reshard_optimizer
from t1ops.errors import CheckpointError, ConfigError
from t1ops.guards.checkpoints import file_sha256, list_steps, step_dir_name
from t1ops.guards.sharded_checkpoints import verify_role
from t1ops.overrides import dotted

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "coordinator-crash": ("trainer.save_every", "checkpoints.keep_last", "checkpoints.keep_every"),
}

STATE_ROLE = "trainer_state"
STATE_FILE = "state.pt"
PARTIAL_STATE = ".partial-ranks"  # per-rank trainer-state files before rank 0 moves them into the step
MANIFEST = "manifest.json"
# config keys a resume may change; any other difference is refused
RESUMABLE_KEYS = {"run.steps", "run.out_dir", "run.ray_address", "run.num_cpus", "telemetry", "guards", "eval",
                  "checkpoints", "tracking", "trainer.parallel"}  # another layout re-shards (t1ops.campaign.reshard)


def save_trainer_state(base: str | Path, step: int, state: dict, rank_files: list[dict] | None = None) -> Path:
    """Atomically write ``<base>/trainer_state/step_S/{state.pt, manifest.json}``; ``rank_files``: the
    per-rank files :func:`save_rank_state` wrote (moved in, each with its sha256 in the manifest)."""
    role_dir = Path(base) / STATE_ROLE
    role_dir.mkdir(parents=True, exist_ok=True)
    final = role_dir / step_dir_name(step)
    if final.exists():
        raise CheckpointError(f"trainer state {final} already exists and is never overwritten", path=str(final))

    def fill(tmp: Path) -> None:
        torch.save(state, tmp / STATE_FILE)
        manifest = {"role": STATE_ROLE, "step": step, "file_sha256": file_sha256(tmp / STATE_FILE)}
        if rank_files is not None:
            for entry in rank_files:
                os.rename(role_dir / PARTIAL_STATE / entry["file"], tmp / entry["file"])
            manifest["ranks"] = sorted(rank_files, key=lambda e: e["rank"])
        (tmp / MANIFEST).write_text(json.dumps(manifest))

    return publish_dir(final, fill)


def save_rank_state(base: str | Path, step: int, rank: int, trainer) -> dict:
    """This rank's optimizer and RNG state in its own file (a world > 1: nothing is gathered; rank 0 then
    moves every rank's file into the step with :func:`save_trainer_state`); returns its manifest entry."""
    out = Path(base) / STATE_ROLE / PARTIAL_STATE
    out.mkdir(parents=True, exist_ok=True)
    name = f"step{step:08d}-rank{rank:05d}.pt"
    path = publish_file(out / name, lambda f: torch.save(rank_state(trainer), f))
    return {"rank": rank, "file": name, "sha256": file_sha256(path)}


def save_rank_states(base: str | Path, step: int, rank: int, world_size: int, trainer,
                     watch=contextlib.nullcontext) -> list[dict] | None:
    """Every rank at once (a collective): each writes its own optimizer and RNG file
    (:func:`save_rank_state`); rank 0 gets every file's entry, for :func:`save_trainer_state`."""
    entry = save_rank_state(base, step, rank, trainer)
    entries = [None] * world_size if rank == 0 else None
    with watch("trainer state save"):
        torch.distributed.gather_object(entry, entries, dst=0)
    return entries


def restore_rank_state(trainer, base: str | Path, step: int, rank: int, world_size: int) -> tuple[dict, str]:
    """This rank's part of the verified trainer state at ``step`` into ``trainer``: its step count, its
    optimizers and RNG (its own file at the saved layout, else re-sharded from every saved rank's,
    memory-mapped). Returns the state (step, next step) and how ("own state" / "re-sharded")."""
    state = load_trainer_state(base, step, rank=rank)  # this rank's file only
    trainer.step = int(state["step"])
    how = load_rank_state(trainer, state, rank=rank, world_size=world_size,
                          every_rank=lambda: load_trainer_state(base, step, mmap=True)["ranks"])
    return state, how


def trainer_state(trainer, version: int, ranks: list[dict]) -> dict:
    """The trainer state a resume at ``version`` needs: step count, data-sampler position and
    every rank's optimizer and RNG state (``t1ops.campaign.trainer_host.rank_state``)."""
    return {"step": trainer.step, "next_step": version + 1, "ranks": ranks}


def load_trainer_state(base: str | Path, step: int, rank: int | None = None, *, ranks: bool = True,
                       mmap: bool = False) -> dict:
    """The verified trainer state at ``step``; CheckpointError (files left as they are) otherwise. A state
    saved per rank has its ``ranks`` read from the rank files: only ``rank``'s when given (the others
    None), none with ``ranks=False`` (verification only), else all (``mmap``: memory-mapped, read as used:
    a re-shard reads every rank's file); every file's checksum is checked."""
    d = Path(base) / STATE_ROLE / step_dir_name(step)
    try:
        manifest = json.loads((d / MANIFEST).read_text())
        files = [(STATE_FILE, manifest.get("file_sha256"))] + [(e["file"], e["sha256"])
                                                               for e in manifest.get("ranks", [])]
        ok = manifest.get("step") == step and all(file_sha256(d / f) == sha for f, sha in files)
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as err:
        raise CheckpointError(f"trainer state {d} is missing or unreadable ({type(err).__name__}: {err})",
                              path=str(d)) from None
    if not ok:
        raise CheckpointError(f"trainer state {d} differs from its manifest (a truncated or corrupt file); it "
                              "was left as is", path=str(d))
    # weights_only: tensors, dicts, lists and numbers only (RNG states are stored as tensors / lists)
    state = torch.load(d / STATE_FILE, map_location="cpu", weights_only=True)
    if "ranks" in manifest:
        state["ranks"] = [torch.load(d / e["file"], map_location="cpu", weights_only=True, mmap=mmap)
                          if ranks and rank in (None, e["rank"]) else None for e in manifest["ranks"]]
    return state


@dataclass
class ResumePoint:
    step: int
    actor_steps: list[int]
    critic_steps: list[int]
    state_steps: list[int]
    skipped: dict[int, str] = field(default_factory=dict)  # newer common steps that failed verification

    @property
    def message(self) -> str:
        top = {"actor": max(self.actor_steps, default=None), "critic": max(self.critic_steps, default=None),
               "trainer state": max(self.state_steps, default=None)}
        text = (f"resuming from step {self.step}: the newest step at which actor, critic and trainer state "
                f"all exist and verify (newest saved: " + ", ".join(f"{k} {v}" for k, v in top.items()
                                                                     if v is not None) + ")")
        if len({v for v in top.values() if v is not None}) > 1:
            text += f"; the roles disagree, so the common step {self.step} is used"
        if self.skipped:
            text += "; skipped " + "; ".join(f"step {s}: {why}" for s, why in sorted(self.skipped.items()))
        return text


def plan_resume(ckpt_base: str | Path, needs_critic: bool) -> ResumePoint:
    """The newest step whose actor, critic (when ``needs_critic``) and trainer state all verify."""
    base = Path(ckpt_base)
    actor, critic, state = (list_steps(base / r) for r in ("actor", "critic", STATE_ROLE))
    common = set(actor) & set(state) & (set(critic) if needs_critic else set(actor))
    point = ResumePoint(-1, actor, critic, state)
    for step in sorted(common, reverse=True):
        try:
            verify_role(base / "actor" / step_dir_name(step), "actor")  # whole or by shard
            if needs_critic:
                verify_role(base / "critic" / step_dir_name(step), "critic")
            load_trainer_state(base, step, ranks=False)
        except CheckpointError as err:
            point.skipped[step] = str(err).split(";")[0]
            continue
        point.step = step
        return point
    raise CheckpointError(f"nothing to resume in {base}: no step at which actor (steps {actor[-5:]}), "
                          + (f"critic (steps {critic[-5:]}) " if needs_critic else "")
                          + f"and trainer state (steps {state[-5:]}) all exist and verify"
                          + (f" (failed: {point.skipped})" if point.skipped else "")
                          + "; start a new run instead", path=str(base))


def check_same_campaign(stored: dict, cfg: dict) -> None:
    """Refuse a resume whose config differs from the run's own beyond RESUMABLE_KEYS. A key the run's
    config.json lacks (added to the schema after the run started) counts as its default."""
    from t1ops.config import CampaignConfig

    defaults, flat = dotted(CampaignConfig().model_dump()), dotted(stored)
    flat.update({k: v for k, v in defaults.items() if k not in flat and k in dotted(cfg)})
    diffs = sorted(k for k in flat.keys() | dotted(cfg).keys()
                   if flat.get(k) != dotted(cfg).get(k) and not _resumable(k))
    if diffs:
        flat_s, flat_c = flat, dotted(cfg)
        shown = "; ".join(f"{k}: run has {flat_s.get(k)!r}, config has {flat_c.get(k)!r}" for k in diffs[:6])
        raise ConfigError(f"the config differs from the run's own config.json in {len(diffs)} key(s) that a "
                          f"resume cannot change ({shown}). Resume with the run's config (its config.json), "
                          "or start a new run.", keys=diffs)


def _resumable(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)


_DUMP_STEP = re.compile(r"^st(\d+)-")


def supersede_after(run_path: Path, step: int) -> Path | None:
    """Move what a crashed run wrote after ``step`` into ``superseded/<timestamp>/``; return it (None if nothing)."""
    dest = run_path / "superseded" / time.strftime("%Y%m%d-%H%M%S")
    moved = 0
    for role in ("actor", "critic", STATE_ROLE, "actor-shards", "critic-shards"):
        role_dir = run_path / "checkpoints" / role
        for s in list_steps(role_dir):
            if s > step:
                _move(role_dir / step_dir_name(s), dest / "checkpoints" / role)
                moved += 1
    dumps = run_path / "dumps"
    for f in sorted(dumps.glob("st*")) if dumps.is_dir() else []:
        m = _DUMP_STEP.match(f.name)
        if m and int(m.group(1)) > step:
            _move(f, dest / "dumps")
            moved += 1
    return dest if moved else None


def _move(src: Path, dest_dir: Path) -> None:
    dest_dir.mkdir(parents=True, exist_ok=True)
    os.rename(src, dest_dir / src.name)


def rng_state() -> dict:
    """Python, numpy and torch RNG states of this process, as torch-loadable values."""
    import random

    import numpy as np

    py = random.getstate()
    np_state = np.random.get_state()
    return {"python": [py[0], list(py[1]), py[2]], "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()),
                                                            *np_state[2:]],
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    import random

    import numpy as np

    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy(), *n[2:]))
    torch.set_rng_state(state["torch"])


def rank_state(trainer) -> dict:
    """One rank's share of the trainer state: its optimizers' states, its RNG, and what each optimizer
    parameter is in the whole model (``t1ops.campaign.reshard``: a resume at another layout)."""
    return {"rng": rng_state(), "actor_optimizer": trainer.actor_optimizer.state_dict(),
            "critic_optimizer": None if trainer.critic_optimizer is None else trainer.critic_optimizer.state_dict(),
            "params": param_layout(trainer)}


def load_rank_state(trainer, state: dict, *, rank: int, world_size: int, every_rank=None) -> str:
    """Restore this rank's optimizers and RNG: its own file when the state was saved at this layout
    ("own state"), else re-sharded from every saved rank's (``every_rank()``: all their states, e.g.
    memory-mapped; "re-sharded"). A state saved before parameter layouts were recorded resumes only at
    its own world size."""
    ranks = state.get("ranks") or [state]  # a state written before per-rank states: one rank
    layout = param_layout(trainer)
    mine = ranks[rank] if len(ranks) == world_size else None
    if mine is not None and mine.get("params", layout) == layout:
        trainer.actor_optimizer.load_state_dict(mine["actor_optimizer"])
        if trainer.critic_optimizer is not None:
            trainer.critic_optimizer.load_state_dict(mine["critic_optimizer"])
        set_rng_state(mine["rng"])
        return "own state"
    saved = every_rank() if every_rank is not None else None
    if not saved or any(s is None or "params" not in s for s in saved):
        raise ConfigError(f"the trainer state holds {len(ranks)} rank(s) of another layout than this trainer's "
                          f"{world_size} and records no parameter layout (saved before re-sharding existed); "
                          "resume with the run's own trainer.parallel", key="trainer.parallel")
    for role, opt_name in ROLES:
        opt = getattr(trainer, opt_name)
        if opt is not None:
            opt.load_state_dict(reshard_optimizer(saved, role, layout[role], opt.state_dict()))
    set_rng_state(saved[rank % len(saved)]["rng"])
    return "re-sharded"


def resumed(host, step: int, state: dict, has_critic: bool) -> dict:
    """What a resume loaded (the coordinator logs it and records ``campaign.resumed``)."""
    return {"step": step, "trainer_step": host.trainer.step, "next_step": int(state["next_step"]),
            "actor": str(host.ckpt.actor_dir / f"step_{step:08d}"),
            "critic": str(host.ckpt.critic_dir / f"step_{step:08d}") if has_critic else None}


def open_for_resume(run_dir: str | Path, cfg) -> tuple:
    """(RunDir, ResumePoint, the previous summary.json) for ``--resume``; refuses before anything starts."""
    from t1ops.campaign.rundir import RunDir

    path = Path(run_dir).resolve()
    stored = path / "config.json"
    if not stored.is_file():
        raise ConfigError(f"--resume {run_dir}: {stored} does not exist; point --resume at a run directory "
                          "that `t1ops run` created (it holds config.json, summary.json, checkpoints/)",
                          path=str(path))
    check_same_campaign(json.loads(stored.read_text()), json.loads(cfg.model_dump_json()))
    point = plan_resume(path / "checkpoints", needs_critic=cfg.trainer.mode == "ppo")
    if point.step >= cfg.run.steps:
        raise ConfigError(f"--resume {run_dir}: the run already holds step {point.step} and run.steps is "
                          f"{cfg.run.steps}; pass --steps N (N > {point.step}) to continue it", key="run.steps")
    summary_path = path / "summary.json"
    previous = json.loads(summary_path.read_text()) if summary_path.is_file() else {"steps": []}
    moved = supersede_after(path, point.step)
    late = [r for r in previous.get("steps", []) if r["step"] > point.step]
    if late:  # the rows of steps that run again are kept beside the superseded checkpoints
        moved = moved or path / "superseded" / time.strftime("%Y%m%d-%H%M%S")
        moved.mkdir(parents=True, exist_ok=True)
        (moved / "summary-steps.json").write_text(json.dumps(late, indent=1, default=str))
    previous["_superseded"] = str(moved) if moved else None
    return RunDir(path.name, path), point, previous


def resumed_summary(summary, previous: dict, point: ResumePoint) -> None:
    """Carry the previous summary's rows up to the resume step into ``summary``; record the resume."""
    summary.steps[:] = [r for r in previous.get("steps", []) if r["step"] <= point.step]
    summary.evals[:] = [e for e in previous.get("eval", []) if e["step"] <= point.step]
    summary.extra["warm_start_loss"] = previous.get("warm_start_loss", summary.extra.get("warm_start_loss"))
    if previous.get("async_resumes"):  # fully_async: the group books carried across earlier crashes
        summary.extra["async_resumes"] = list(previous["async_resumes"])
    rerun = sorted(r["step"] for r in previous.get("steps", []) if r["step"] > point.step)
    summary.extra["resumes"] = previous.get("resumes", []) + [
        {"from_step": point.step, "message": point.message, "steps_run_again": rerun,
         "superseded": previous.get("_superseded"), "at": time.strftime("%Y-%m-%dT%H:%M:%S")}]
    summary.save()
