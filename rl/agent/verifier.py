"""The CTRF verifier, run after the agent finishes, with tamper detection.

Report section 10: "Verifier integrity is filtered, not enforced. The verifier
executes in the agent-controlled sandbox with no runtime tamper detection."
Here it is enforced:

1. the agent's processes are swept, then the trial is scanned for forgeries
   (a pre-written ctrf.json, a planted conftest.py / pytest.ini, a ``pytest``
   or ``python`` executable, a pre-created tests/ or verifier/ dir);
2. the task's tests/ are re-hashed against the digest taken at load time,
   copied in from the task (never from the trial), made read-only, and
   hashed again; the same check runs after the verifier;
3. verifier/ is created here, with a ``run_tag`` file naming this run and
   trial; ``/tests/test.sh`` runs in a fresh namespace set as the trial's own
   verifier uid (``Trial.run_verifier``): the workspace at ``/app``, tests at
   ``/tests`` (read-only), ``/logs/verifier``, a fresh ``/tmp``, nothing else
   the agent wrote, and a clean environment whose pytest is pinned
   (``PYTEST_ADDOPTS``: ``-c`` of the task's own ini or an empty one,
   ``--rootdir``/``--confcutdir`` at ``/tests``, ``-p no:cacheprovider``;
   no plugin autoload but the CTRF one);
4. the CTRF report is accepted only if it was written during this verifier
   run (its summary start/stop lie inside the run) and the run tag still
   matches; ``result.json`` records the reward with the tag.

The reward itself is decided by rl/agent/verdict.py (CTRF, then Harbor's
reward.json / reward.txt, else 0 tagged ``no-verdict``; never the exit code).
Any tamper event voids the forged path: reward 0, source ``tamper:<kinds>``. A scan
that cannot finish is the ``scan-failed`` event: reward 0, recorded. docs/sandbox.md
has the threat model.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets as _secrets
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.agent import verifying
from rl.agent.ctrf import read_ctrf
from rl.agent.sandbox import PINNED_PYTEST_INI, VERIFIER_LIMITS, ExecResult, Limits, Trial
from rl.agent.secrets import redact, redact_obj
from rl.agent.tamper import TamperEvent, scan_trial_dir, scan_tree
from rl.agent.tasks import hash_tree
from rl.agent.verdict import (SOURCE_NO_VERDICT, InconsistentVerdict, counted_report, decide,
                              foreign_reward_files, no_verdict, report_expected)
from rl.agent.verifier_env import git_env, import_dirs, task_env_for_verifier, verifier_search_path
from rl.errors import ParseError, TaskError, TrialDirError, VerifierTimeoutError
from rl.rewards import RewardResult, ctrf_reward

# The failure ids of the catalogue (docs/failures.md) this guard catches, each with the config keys
# that govern it (`t1ops explain ID`; tests/t1ops/test_explain.py keeps them in step).
CATCHES = {
    "stale-trial-dirs": (),
    "verifier-tamper": (),
}

log = logging.getLogger("rl.agent.verifier")

_TRIAL_ENTRIES = {"fs", "logs", "trial.json", ".root", "solution"}   # before verification
_CLOCK_SLACK_MS = 2_000


@dataclass(frozen=True)
class VerifierResult:
    """The verdict on one trial. ``reason``: ok | tamper | no-verdict | verifier-timeout | a
    sandbox limit (memory_limit, cpu_limit, ...) that ended the verifier."""

    trial_id: str
    run_tag: str
    reward: RewardResult
    tamper_events: tuple[TamperEvent, ...]
    exit_code: int | None
    reason: str
    duration_s: float
    output: ExecResult | None = None
    budget_s: float | None = None           # the verifier's timeout: the task's, capped by the campaign
    verifier_pids: tuple[int, ...] = ()     # its processes while it ran (rl/agent/verifying.py)

    @property
    def tampered(self) -> bool:
        return bool(self.tamper_events)


def run_tag_for(trial: Trial) -> str:
    """The tag every verifier output of this trial must carry: ``<run_id>/<trial_id>``."""
    return f"{trial.run_id}/{trial.trial_id}"


def scan_for_tampering(trial: Trial, env: dict[str, str] | None = None) -> list[TamperEvent]:
    """Everything in the trial that only a forger would put there (read-only, iterative);
    a scan that fails is itself a ``scan-failed`` event. ``env``: the verifier's environment
    (which workspace dirs are on its import path)."""
    tid = trial.trial_id
    dirs = import_dirs(env or {}, trial.workdir, trial.task.tests_snapshot)
    try:
        events = scan_trial_dir(tid, trial.dir, _TRIAL_ENTRIES)
        events += scan_tree(tid, trial.workspace, trial.task.environment_dir, dirs)
        events += scan_tree(tid, trial.fs / "logs_agent", trial.task.environment_dir / ".none")
    except Exception as e:   # a hostile tree must end in a verdict, never a crash
        events = [TamperEvent(tid, "scan-failed", str(trial.dir), f"{type(e).__name__}: {e}")]
    return events + _tests_intact(trial, trial.task.tests_dir,
                                  "task tests/ changed since the task was loaded")


def _tests_intact(trial: Trial, where: Path, detail: str) -> list[TamperEvent]:
    try:
        digest, _ = hash_tree(where)
    except (TaskError, OSError) as e:
        return [TamperEvent(trial.trial_id, "tests-modified", str(where), f"{detail}: {e}")]
    if digest != trial.task.tests_digest:
        return [TamperEvent(trial.trial_id, "tests-modified", str(where), detail)]
    return []


def _quarantine(path: Path) -> None:
    """Move a forged tests/ or verifier/ aside (kept for the post-mortem, never used)."""
    if path.exists() or path.is_symlink():
        path.rename(path.with_name(f"{path.name}.tampered-{_secrets.token_hex(3)}"))


def _install_tests(trial: Trial) -> Path:
    """Write the load-time snapshot of tests/ in, read-only, checked against the load-time digest."""
    dst = trial.dir / "tests"
    dst.mkdir()
    for rel, data in trial.task.tests_snapshot.items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes(data)
    digest, _ = hash_tree(dst)
    if digest != trial.task.tests_digest:
        raise TaskError(f"{trial.task.name}: tests/ digest {digest[:12]} != load-time "
                        f"{trial.task.tests_digest[:12]}; reload the task", task=trial.task.name)
    for p in [dst, *dst.rglob("*")]:
        os.chmod(p, 0o555 if p.is_dir() or p.name.endswith(".sh") else 0o444)
    return dst


def _pinned_ini(trial: Trial) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The ``-c`` file: the task's own tests/pytest.ini, else an empty one made for the jail."""
    if "pytest.ini" in trial.task.tests_snapshot:
        return "/tests/pytest.ini", ()
    return PINNED_PYTEST_INI, ((PINNED_PYTEST_INI, "[pytest]\n"),)


def _verifier_env(trial: Trial, tag: str, ini: str) -> dict[str, str]:
    """The verifier's whole environment, written here (issue #51; nothing else of the image's
    ``ENV`` reaches it on either backend): local: the host venv's pytest; container: the
    image's own PATH (its pytest), in both less every directory the agent could write."""
    path = getattr(trial, "verifier_path", None)
    path = path() if path is not None else f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    # the image's ENV and [environment.env] first, as in Harbor's container, less what loads
    # code or names the agent's paths (rl/agent/verifier_env.py); then [verifier.env], the
    # task author's declared intent, as declared
    image_and_task = {**getattr(trial, "image_env", {}), **trial.env}   # the built image's whole ENV (container)
    return {"PYTHONSAFEPATH": "1", **task_env_for_verifier(image_and_task, trial.workdir), **git_env(),
            **trial.task.verifier_env,
            "PATH": verifier_search_path(path, trial.workdir), "HOME": "/tmp", "TMPDIR": "/tmp",
            "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
            # only the CTRF plugin: no entry-point plugin an agent (or a stray package) provides
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_PLUGINS": "ctrf.main",
            "PYTEST_ADDOPTS": f"-c {ini} --rootdir=/tests --confcutdir=/tests -p no:cacheprovider",
            "T1_WORKSPACE": trial.workdir, "T1_TESTS_DIR": "/tests",
            "T1_CTRF_PATH": "/logs/verifier/ctrf.json", "T1_RUN_TAG": tag}


def accept_ctrf(vdir: Path, tag: str, t0_ms: float, t1_ms: float) -> dict[str, Any]:
    """The verifier's CTRF report, if and only if it carries this run's tag and was written
    inside [t0_ms, t1_ms]. A previous run's file is a TrialDirError (stale-trial-dirs)."""
    tag_file = vdir / "run_tag"
    found = tag_file.read_text().strip() if tag_file.is_file() else None
    if found != tag:
        raise TrialDirError(f"{vdir}: verifier output carries run tag {found!r}, this run is {tag!r}; "
                            "a reused trial dir holds another run's results", path=str(vdir),
                            found=found, expected=tag)
    doc = read_ctrf(vdir / "ctrf.json")
    summary = doc["results"]["summary"]
    start, stop = summary.get("start"), summary.get("stop")
    if start is None or stop is None or not (t0_ms - _CLOCK_SLACK_MS <= start <= stop
                                             <= t1_ms + _CLOCK_SLACK_MS):
        raise TrialDirError(f"{vdir / 'ctrf.json'}: written at {start}..{stop} ms, outside this "
                            f"verifier run {t0_ms:.0f}..{t1_ms:.0f} ms; refusing a stale report",
                            path=str(vdir), start=start, stop=stop)
    return doc


def verifier_limits(trial: Trial) -> Limits:
    """The verifier's limits: the trial's own memory and cpu (the task's declared resources
    hold for its verifier too), the verifier's larger process and cpu-second budgets."""
    return dataclasses.replace(VERIFIER_LIMITS, memory_mb=trial.limits.memory_mb, cpus=trial.limits.cpus)


def verifier_budget_s(trial: Trial, timeout_cap_s: float | None = None) -> float:
    """The verifier's timeout: the task's ``[verifier] timeout_sec``, capped by the campaign
    (``guards.field.verifier_timeout_cap_s``; slow-verifier)."""
    own = trial.task.verifier_timeout_s
    return own if timeout_cap_s is None else min(own, timeout_cap_s)


def verify(trial: Trial, *, limits: Limits | None = None, scale: float = 20.0,
           timeout_cap_s: float | None = None) -> VerifierResult:
    """Run the task's verifier on a finished trial and compute its reward (see module doc)."""
    limits = verifier_limits(trial) if limits is None else limits
    budget = verifier_budget_s(trial, timeout_cap_s)
    if trial.verified:
        raise TrialDirError(f"trial {trial.trial_id} was already verified; a verdict is final",
                            trial_id=trial.trial_id)
    t_start = time.monotonic()
    trial.verified = True
    trial.finish()
    tag = run_tag_for(trial)
    ini, files = _pinned_ini(trial)
    env = _verifier_env(trial, tag, ini)
    events = scan_for_tampering(trial, env)
    for name in ("tests", "verifier"):
        _quarantine(trial.dir / name)
    tests = _install_tests(trial)
    vdir = trial.dir / "verifier"
    vdir.mkdir(mode=0o755)
    (vdir / "run_tag").write_text(tag + "\n")
    os.chmod(vdir / "run_tag", 0o444)
    if events:   # a forgery voids the trial: run nothing the agent may have prepared
        return _finish(trial, tag, vdir, events, None, t_start, scale)
    t0_ms = time.time() * 1000
    with verifying.Entry(trial.dir.parent, trial.task.name, trial.trial_id, tag, budget) as running:
        out = trial.run_verifier(["/bin/bash", "/tests/test.sh"], env=env, limits=limits, timeout_s=budget,
                                 tests=tests, vdir=vdir, files=files)
    t1_ms = time.time() * 1000
    events += _post_checks(trial, tests)
    if events:
        return _finish(trial, tag, vdir, events, out, t_start, scale)
    reward, reason = _reward(trial, vdir, tag, t0_ms, t1_ms, out, events, scale)
    res = _finish(trial, tag, vdir, events, out, t_start, scale, reward, reason)
    return dataclasses.replace(res, budget_s=budget, verifier_pids=tuple(running.doc["pids"]))


VERIFY_SLACK_S = 60.0   # the scan, the copies and the verdict around the verifier's own timeout


def verify_within(trial: Trial, *, bound_s: float | None = None, timeout_cap_s: float | None = None,
                  **kw: Any) -> VerifierResult:
    """:func:`verify` under a wall-clock bound the caller enforces (``bound_s``, default the
    verifier's budget (:func:`verifier_budget_s`) plus :data:`VERIFY_SLACK_S`): past it the trial's
    processes are killed and the verdict is ``verifier-timeout``, reward 0, whatever verify was
    blocked on."""
    budget = verifier_budget_s(trial, timeout_cap_s)
    bound = budget + VERIFY_SLACK_S if bound_s is None else bound_s
    kw["timeout_cap_s"] = timeout_cap_s
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = verify(trial, **kw)
        except BaseException as e:   # re-raised in the caller's thread
            box["error"] = e

    worker = threading.Thread(target=target, name=f"verify-{trial.trial_id}", daemon=True)
    worker.start()
    worker.join(bound)
    if "error" in box:
        raise box["error"]
    if "result" in box:
        return box["result"]
    if trial.cgroup is not None:
        trial.cgroup.kill_all()
    log.error("verification of trial %s passed its wall-clock bound of %.0fs", trial.trial_id, bound)
    return VerifierResult(trial.trial_id, run_tag_for(trial),
                          no_verdict(f"verification passed its wall-clock bound of {bound:g}s"), (),
                          None, "verifier-timeout", bound, None, budget)


def verifier_timeout_error(task: str, verdict: VerifierResult) -> VerifierTimeoutError:
    """The error a ``verifier-timeout`` verdict becomes in a campaign: no verdict, no reward; the
    trial fails and ``rollout.failed_trials`` decides (slow-verifier)."""
    pids = ",".join(map(str, verdict.verifier_pids)) or "not seen"
    budget = verdict.budget_s if verdict.budget_s is not None else verdict.duration_s
    return VerifierTimeoutError(
        f"verifier of task {task}, trial {verdict.trial_id} (pid {pids}) outlived its {budget:g} s budget "
        "and was killed: no verdict, so no reward; the trial counts as failed (rollout.failed_trials). A slow "
        "reward function, not the trainer or the network: make the verifier faster, or raise the task's "
        "[verifier] timeout_sec and guards.field.verifier_timeout_cap_s. See runbooks/slow-verifier.md",
        task=task, trial_id=verdict.trial_id, pids=list(verdict.verifier_pids), budget_s=budget)


def _finish(trial: Trial, tag: str, vdir: Path, events: list[TamperEvent], out: ExecResult | None,
            t_start: float, scale: float, reward: RewardResult | None = None,
            reason: str = "tamper") -> VerifierResult:
    if reward is None or events:
        kinds = ",".join(sorted({e.kind for e in events}))
        base = ctrf_reward(None, solved=False, scale=scale)
        reward, reason = dataclasses.replace(base, source=f"tamper:{kinds}", ctrf_fallback=None), "tamper"
    if reward.detail:   # a detail may quote a file the agent wrote: redacted like its output
        reward = dataclasses.replace(reward, detail=redact(reward.detail, trial.secrets))
    events = [dataclasses.replace(e, detail=redact(e.detail, trial.secrets), path=redact(e.path, trial.secrets))
              for e in events]
    for ev in events:
        log.warning("tamper event in trial %s: %s at %s (%s)", ev.trial_id, ev.kind, ev.path, ev.detail)
    result = VerifierResult(trial.trial_id, tag, reward, tuple(events),
                            None if out is None else out.exit_code, reason,
                            time.monotonic() - t_start, out)
    _write_result(vdir, result, trial.secrets)
    return result


def _post_checks(trial: Trial, tests: Path) -> list[TamperEvent]:
    return [ev for where in (tests, trial.task.tests_dir)
            for ev in _tests_intact(trial, where, "tests/ changed while the verifier ran")]


def _reward(trial: Trial, vdir: Path, tag: str, t0_ms: float, t1_ms: float, out: ExecResult,
            events: list[TamperEvent], scale: float) -> tuple[RewardResult | None, str]:
    """The verdict (rl/agent/verdict.py): CTRF, then reward.json/reward.txt, else no-verdict.
    The exit code is never a reward; a limit that ended the verifier names the reason."""
    if out.reason in ("timeout", "budget_exhausted"):
        return no_verdict(f"verifier timed out after {out.duration_s:.1f}s"), "verifier-timeout"
    doc, problem = None, None
    try:
        doc = accept_ctrf(vdir, tag, t0_ms, t1_ms)
    except TrialDirError as e:
        events.append(TamperEvent(trial.trial_id, "stale-ctrf", str(vdir), str(e)))
        return None, "tamper"
    except ParseError as e:
        problem = str(e) if (vdir / "ctrf.json").exists() else "no CTRF report"
    doc, bad = counted_report(doc, trial.task.tests_snapshot) if doc is not None else (None, None)
    if bad is not None:
        events.append(TamperEvent(trial.trial_id, "ctrf-inconsistent", str(vdir / "ctrf.json"),
                                  f"not the pinned runner's own finished report on the task's tests: {bad}"))
        return None, "tamper"
    foreign = foreign_reward_files(vdir, trial.task.tests_snapshot)
    if foreign:
        events.append(TamperEvent(trial.trial_id, "foreign-verdict", str(vdir),
                                  f"{', '.join(foreign)} written, but no file of the task's tests/ "
                                  "names it: not the task's verifier"))
        return None, "tamper"
    try:
        reward = decide(doc, problem, vdir, since_s=t0_ms / 1000, scale=scale,
                        reward_range=trial.task.reward_range, expected=report_expected(trial.task.tests_snapshot))
    except InconsistentVerdict as e:
        events.append(TamperEvent(trial.trial_id, e.kind, str(vdir), str(e)))
        return None, "tamper"
    if out.limit_hit:
        return reward, out.reason
    return reward, "no-verdict" if reward.source == SOURCE_NO_VERDICT else "ok"


def _write_result(vdir: Path, result: VerifierResult, secrets: dict[str, str]) -> None:
    payload = {"run_tag": result.run_tag, "trial_id": result.trial_id, "reason": result.reason,
               "reward": dataclasses.asdict(result.reward) if dataclasses.is_dataclass(result.reward)
               else str(result.reward), "exit_code": result.exit_code,
               "tamper_events": [dataclasses.asdict(e) for e in result.tamper_events]}
    path = vdir / "result.json"
    if path.is_symlink() or path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(redact_obj(payload, secrets), indent=1, default=str))   # nothing leaves unredacted
