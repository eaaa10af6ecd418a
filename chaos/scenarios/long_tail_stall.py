"""long-tail-stall: one slow trial holds up every step of the one-step pipeline.

SkyRL walkthrough, section 2: one sample ends in two turns, another runs for an
hour; section 8: fully async exists for this long tail. The one-step pipeline
drains every in-flight request before each weight sync, so a step waits for
its slowest trial.

Fault (real): a Harbor-layout task whose solution runs ``sleep`` in the
trial's sandbox (``slow-build``, SLEEP_S seconds, between the agent's two
turns), next to quick tasks, in a real campaign (Ray, megatron-core trainer,
embedded engines, sandboxes, verifiers). The policy is warm-started on the
pool's solutions and samples greedily, so it runs them.

- Unguarded: ``run.mode = "one_step"``. The step holding the slow trial takes at
  least SLEEP_S (a sleep is a lower bound, whatever the load); nothing else
  trains meanwhile.
- Guarded: ``run.mode = "fully_async"``. Steps go on while the slow trial
  sleeps: its second turn is sampled under newer weights, so its tokens carry
  two or more versions, and its lag (steps between its start and its training)
  is recorded in the step row (a staleness violation when above budget).
  An engine is SIGKILLed as step 2 starts: every submitted group is settled
  exactly once, none failed, and no sample id appears twice in the dumps.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from chaos.procs import event_since

REPO = Path(__file__).resolve().parents[2]
SLEEP_S = 12          # under the agent's 20 s command timeout; several tiny steps long
QUICK_TASKS = ("files-touch", "shell-pwd")
SLOW_TASK = "slow-build"


def make_pool(root: Path) -> Path:
    """Two bundled quick tasks and the slow one (a copy of files-touch whose solution sleeps first)."""
    pool = root / "tasks"
    for name in QUICK_TASKS:
        shutil.copytree(REPO / "examples" / "tasks" / name, pool / name)
    slow = pool / SLOW_TASK
    shutil.copytree(REPO / "examples" / "tasks" / "files-touch", slow)
    (slow / "instruction.md").write_text("Run the slow build step, then create three empty files: "
                                         "a.txt, b.txt and c.txt.\n")
    (slow / "solution" / "solve.sh").write_text(f"#!/bin/bash\nsleep {SLEEP_S} && touch a.txt b.txt c.txt\n")
    toml = (slow / "task.toml").read_text().replace('family = "files"', 'family = "build"')
    (slow / "task.toml").write_text(toml.replace("timeout_sec = 30.0", "timeout_sec = 120.0", 1))
    return pool


def campaign_config(pool: Path, mode: str, steps: int):
    from t1ops.config import load_toml

    cfg = load_toml(REPO / "examples" / "tiny" / "campaign.toml")
    cfg.run.mode, cfg.run.steps = mode, steps
    cfg.run.ray_address = "local"  # a fresh local Ray per run, never another job's cluster left on this host
    cfg.rollout.tasks_dir, cfg.rollout.num_train_tasks = str(pool), None
    cfg.rollout.batch_size, cfg.rollout.n_samples_per_prompt = 2, 1   # two groups of one trial per step
    cfg.rollout.temperature = 0.0                                      # greedy: the policy runs the solutions
    cfg.trainer.warm_start_steps, cfg.trainer.warm_start_noise = 80, 0.0   # loss 4.6 -> 0.01: greedy runs the solutions
    cfg.trainer.ppo_epochs = 1
    cfg.engine.num_engines = 2
    cfg.eval.every_steps = 0                                           # the pool is the training set
    cfg.fully_async.num_parallel_generation_workers = 3
    cfg.fully_async.max_staleness_steps = 1
    cfg.fully_async.zero_variance_filter = False                       # groups of one have no variance
    cfg.fully_async.staleness_alarm_share = 1.0
    return cfg


def _dumps(run_dir: Path) -> list[dict]:
    from t1ops.audit import read_trajectory

    out = []
    for p in sorted((run_dir / "dumps").glob("*.npz")):
        t = read_trajectory(p)
        versions = sorted({int(v) for v in t.policy_version[t.loss_mask == 1]})
        out.append({"sample_id": t.meta["sample_id"], "task": t.meta.get("task"), "step": t.meta.get("step"),
                    "versions": versions})
    return out


def _kill_engine_at(step: int, fired: dict):
    def hook(c, s):
        import ray

        if s != step or fired:
            return
        pids = ray.get(c.router.engine_pids.remote())
        fired.update(at=time.time())
        os.kill(pids[0], signal.SIGKILL)
        fired.update(step=s, pid=pids[0])
    return hook


@register("long-tail-stall", "one slow trial holds up every step of the one-step pipeline")
def run(tmp: Path) -> Outcome:
    from t1ops.campaign.launch import run_campaign

    pool = make_pool(tmp)
    one = run_campaign(campaign_config(pool, "one_step", 2), out_dir=str(tmp / "one_step"), show_progress=False)
    one_steps = json.loads((one / "summary.json").read_text())["steps"]
    one_slow = [d for d in _dumps(one) if d["task"] == SLOW_TASK]
    slow_steps = sorted({d["step"] for d in one_slow})
    stalled = [s for s in one_steps if s["step"] in slow_steps and s["step_s"] >= SLEEP_S]

    killed: dict = {}
    fa = run_campaign(campaign_config(pool, "fully_async", 6), out_dir=str(tmp / "fully_async"),
                      show_progress=False, on_step=[_kill_engine_at(2, killed)])
    summary = json.loads((fa / "summary.json").read_text())
    rows, books = summary["steps"], summary["async_books"]
    dumps = _dumps(fa)
    slow = [d for d in dumps if d["task"] == SLOW_TASK]
    slow_multi = [d for d in slow if len(d["versions"]) >= 2]
    lags = {g: lag for r in rows for g, lag in r["group_lags"].items() if SLOW_TASK in g}
    dup = [i for i, n in Counter(d["sample_id"] for d in dumps).items() if n > 1]
    recreated = [r["step"] for r in rows if r.get("engines_recreated")]
    # Steps trained while a slow group was in flight, read from the ledger (not the clock: on a loaded
    # host every step can outlast the sleep): a group that started at step s and trained at step t with
    # lag t - s let the steps s+1 .. t-1 train without it.
    slow_trained_at = {g: r["step"] for r in rows for g in r["group_lags"] if SLOW_TASK in g}
    went_on = sorted({r["step"] for r in rows for g, t in slow_trained_at.items()
                      if t - lags[g] < r["step"] < t and g not in r["group_lags"]})

    tl = Timeline()  # the engine SIGKILLed mid-run (fully_async): its death named, the next step synced
    if killed:
        tl.fault(at=killed["at"])
        tl.after_fault(detected=event_since(fa, "engine.dead", killed["at"]),
                       healthy=event_since(fa, "campaign.sync_done", killed["at"]))
    fault_fired = bool(one_slow) and bool(slow)  # the slow task ran (its trial slept) in both modes
    unguarded = (f"one_step: step(s) {slow_steps} held the {SLEEP_S} s slow trial and took "
                 f"{[round(s['step_s'], 1) for s in stalled]} s; the other trial of the batch and the "
                 f"trainer waited for it" if stalled else f"one_step: no step stalled ({one_steps})")
    caught = bool(slow_multi) and bool(lags) and max(lags.values()) >= 2
    return Outcome(
        fault_fired=fault_fired, unguarded=unguarded if stalled else "",
        guarded=Guarded(caught=caught, error="" if caught else
                        f"fully_async: slow trajectories {slow}, lags {lags}: no trajectory spanned a sync"),
        invariants={"unguarded_one_step_stalled_on_the_slow_trial": bool(stalled),
                    "slow_trial_tokens_carry_two_or_more_versions": bool(slow_multi),
                    "slow_trial_lag_recorded": bool(lags) and max(lags.values()) >= 2,
                    "steps_kept_going_while_it_slept": len(went_on) >= 1,
                    "engine_killed_mid_step": bool(killed),
                    "killed_engine_recreated": bool(recreated),
                    "every_group_settled_once": books["balanced"],
                    "no_group_failed": books["failed"] == 0,
                    "no_trajectory_duplicated": not dup},
        details={"one_step_rows": [{k: s[k] for k in ("step", "step_s", "rollout_s")} for s in one_steps],
                 "fully_async_rows": [{k: r[k] for k in ("step", "step_s", "rollout_s", "version_lag_tokens",
                                                        "group_lags", "staleness_violations", "violation_lags")}
                                      for r in rows],
                 "slow_trajectories": slow, "steps_trained_while_slow_in_flight": went_on, "books": books,
                 "killed": killed, "recreated_at_steps": recreated},
        recovery=tl.recovery(how=f"fully_async: the slow trial never stalled a step (steps {went_on} trained while "
                                 f"it slept); the killed engine: its next step synced, recreated in place"))
