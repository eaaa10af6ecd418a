"""stale-trial-dirs: a reused trial dir hands a trial another run's reward.

T1 report, section 09: "Trial directories are outputs, but their names carry
no run tag; pointing a new run's trial dir at an old run's tree lets a trial
that failed to emit CTRF read the previous model's ctrf.json as its own
reward, with no error. In the inspected legacy directory only 47/400 trials
had one, making stale reads likely."

Fault: a real previous run ("run-old") solves ``text-sort`` in the sandbox and
its real verifier writes ``verifier/ctrf.json`` (4/4). The new run reuses that
directory (deterministic legacy name); its agent does nothing and its
verifier is killed by a verifier timeout before pytest writes a report.

- Unguarded: the legacy reward hook reads ``<trial>/verifier/ctrf.json``.
  Observed: 4/4 passed, reward 0.2 from source ``ctrf`` for a trial that did nothing.
- Guarded: (1) ``accept_ctrf`` (what ``verify`` reads the report with) refuses the file: its
  run tag names run-old; (2) the sandbox gives the new trial a fresh
  ``<root>/<run_id>/<task>-<idx>-<uuid>`` dir, so its verifier timeout yields
  the fallback reward 0.0, never the stale 0.2.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register
from rl.agent.sandbox import Sandbox
from rl.agent.tasks import load_task
from rl.agent.verifier import accept_ctrf, verify
from rl.errors import TrialDirError
from rl.rewards import ctrf_reward

POOL = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def _slow_verifier_task(tmp: Path) -> Path:
    """text-sort whose verifier times out before pytest can write its report."""
    src = tmp / "pool" / "text-sort"
    shutil.copytree(POOL / "text-sort", src)
    toml = (src / "task.toml").read_text().replace("[verifier]\ntimeout_sec = 60.0",
                                                   "[verifier]\ntimeout_sec = 0.05")
    (src / "task.toml").write_text(toml)
    return src


def _previous_run(root: Path) -> Path:
    """A real earlier run: solve, verify (real pytest), leave the trial dir behind."""
    old = Sandbox(root, "run-old").create(load_task(POOL / "text-sort"), 0)
    old.exec("sort in.txt > out.txt", timeout_s=20)
    verify(old)
    old.close()
    return old.dir


def _unguarded(old_dir: Path, task_dir: Path, sandbox: Sandbox) -> dict:
    """Legacy: the new run's trial named text-sort-0 lands in the old dir and re-runs there."""
    task = load_task(task_dir)
    stamp = (old_dir / "verifier" / "ctrf.json").stat().st_mtime
    t_new_run = time.time()
    # the legacy verifier, run straight on the host in the reused dir (its workspace is gone
    # with the old trial's tmpfs: the new trial did nothing), killed at the verifier timeout
    (old_dir / "workspace").mkdir(exist_ok=True)
    try:
        subprocess.run(["/bin/bash", str(old_dir / "tests" / "test.sh")], cwd=old_dir / "workspace",
                       env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                            "T1_WORKSPACE": str(old_dir / "workspace"), "T1_TESTS_DIR": str(old_dir / "tests"),
                            "T1_CTRF_PATH": str(old_dir / "verifier" / "ctrf.json")},
                       timeout=task.verifier_timeout_s, capture_output=True)
        reason = "ok"
    except subprocess.TimeoutExpired:
        reason = "timeout"
    out = type("Out", (), {"reason": reason})
    reward = ctrf_reward(old_dir / "verifier" / "ctrf.json", solved=False)
    return {"verifier_reason": out.reason, "reward": reward.value, "source": reward.source,
            "passed": reward.passed, "ctrf_from_before_this_run": stamp < t_new_run}


@register("stale-trial-dirs", "a reused trial dir hands a trial the previous run's ctrf.json")
def run(tmp: Path) -> Outcome:
    root = tmp / "trials"
    old_dir = _previous_run(root)
    task_dir = _slow_verifier_task(tmp)
    new_sandbox = Sandbox(root, "run-new")
    ung = _unguarded(old_dir, task_dir, new_sandbox)
    fired = ung["verifier_reason"] != "ok" and ung["ctrf_from_before_this_run"]

    new_tag = f"run-new/{old_dir.name}"
    t0 = time.monotonic()
    errors = []
    for check in (lambda: accept_ctrf(old_dir / "verifier", new_tag, 0.0, time.time() * 1000),):
        try:
            check()
        except TrialDirError as e:
            errors.append(str(e))
    detection_s = time.monotonic() - t0
    tl = Timeline()  # from the stale ctrf.json offered to the new run: refused; a fresh trial dir verified
    tl.fault(at=t0)
    tl.after_fault(detected=detection_s if errors else None)
    fresh = new_sandbox.create(load_task(task_dir), 0)
    verdict = verify(fresh)
    if verdict.reward.source != "ctrf":
        tl.healthy()
    fresh.close()
    return Outcome(
        fault_fired=fired and ung["reward"] > 0,
        unguarded=(f"new run's trial did nothing, its verifier ended by {ung['verifier_reason']}, yet "
                   f"the reward hook read {ung['passed']} passes -> reward {ung['reward']:.2f} "
                   f"(source {ung['source']}) from run-old's ctrf.json"),
        guarded=Guarded(caught=len(errors) == 1, detection_s=detection_s, error=errors[0] if errors else ""),
        invariants={"unguarded_paid_a_stale_reward": fired and ung["reward"] > 0,
                    "fresh_dir_per_run": fresh.dir != old_dir and fresh.dir.parent.name == "run-new",
                    "no_stale_reward": verdict.reward.value == 0.0 and verdict.reward.source != "ctrf",
                    "new_trial_has_no_ctrf": not (fresh.dir / "verifier" / "ctrf.json").exists()},
        details={"unguarded": ung, "guarded_reason": verdict.reason,
                 "guarded_source": verdict.reward.source, "old_dir": str(old_dir),
                 "new_dir": str(fresh.dir), "refusals": errors},
        recovery=tl.recovery(how="in place: the stale file refused; the trial runs in a fresh per-run dir"))
