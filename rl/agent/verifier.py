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
   trial; ``tests/test.sh`` runs as a separate uid with a clean environment
   whose PATH starts at a verifier-owned bin dir (a shadow ``pytest`` is
   never found) and with ``--confcutdir`` at tests/;
4. the CTRF report is accepted only if it was written during this verifier
   run (its summary start/stop lie inside the run) and the run tag still
   matches; ``result.json`` records the reward with the tag.

The reward itself is decided by rl/agent/verdict.py (CTRF, then Harbor's
reward.json / reward.txt, else 0 tagged ``no-verdict``; never the exit code).
Any tamper event voids the forged path: reward 0, source ``tamper:<kinds>``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets as _secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.agent.ctrf import read_ctrf
from rl.agent.sandbox import VERIFIER_LIMITS, ExecResult, Limits, Trial, run_limited
from rl.agent.tasks import hash_tree
from rl.agent.verdict import SOURCE_NO_VERDICT, decide, no_verdict
from rl.errors import ParseError, TaskError, TrialDirError
from rl.rewards import RewardResult, ctrf_reward

log = logging.getLogger("rl.agent.verifier")

_PYTEST_CONFIGS = {"conftest.py", "pytest.ini"}
_SHADOW_NAMES = {"pytest", "py.test", "python", "python3", "bash"}
_TRIAL_ENTRIES = {"workspace", "logs", "trial.json"}   # all a trial holds before verification
_CLOCK_SLACK_MS = 2_000


@dataclass(frozen=True)
class TamperEvent:
    """One forgery attempt found in a trial."""

    trial_id: str
    kind: str        # precreated-ctrf | conftest | pytest-config | shadow-exec | precreated-dir |
                     # tests-modified | foreign-file | stale-ctrf
    path: str
    detail: str = ""


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

    @property
    def tampered(self) -> bool:
        return bool(self.tamper_events)


def run_tag_for(trial: Trial) -> str:
    """The tag every verifier output of this trial must carry: ``<run_id>/<trial_id>``."""
    return f"{trial.run_id}/{trial.trial_id}"


def scan_for_tampering(trial: Trial) -> list[TamperEvent]:
    """Everything in the trial that only a forger would put there (read-only scan)."""
    events: list[TamperEvent] = []
    tid = trial.trial_id

    def add(kind: str, path: Path, detail: str = "") -> None:
        events.append(TamperEvent(tid, kind, str(path), detail))

    for entry in sorted(trial.dir.iterdir()):
        if entry.name in ("tests", "verifier"):
            add("precreated-dir", entry, f"{entry.name}/ existed before the verifier ran")
        elif entry.name not in _TRIAL_ENTRIES:
            add("foreign-file", entry, "outside the workspace")
    for p in sorted(trial.dir.rglob("*")):
        if p.is_relative_to(trial.dir / "logs"):
            continue
        name = p.name
        if name.endswith(".json") and "ctrf" in name.lower():
            add("precreated-ctrf", p, "a CTRF report existed before the verifier ran")
        elif name in _PYTEST_CONFIGS:
            add("conftest" if name == "conftest.py" else "pytest-config", p,
                "pytest would load it if it sat on the collection path")
        elif name in _SHADOW_NAMES and p.is_file() and os.access(p, os.X_OK):
            add("shadow-exec", p, f"executable named {name!r} could shadow the verifier's tools")
    events += _tests_intact(trial, trial.task.tests_dir, "task tests/ changed since the task was loaded")
    return events


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


def _verifier_bin(root: Path) -> Path:
    """A root-owned dir holding only a link to this interpreter's pytest (PATH's first entry)."""
    bindir = root / ".verifier-bin"
    real = Path(sys.executable).parent / "pytest"
    if not real.is_file():
        raise TaskError(f"pytest not found next to {sys.executable}; install pytest-json-ctrf")
    bindir.mkdir(mode=0o755, exist_ok=True)
    link = bindir / "pytest"
    if not link.is_symlink() or os.readlink(link) != str(real):
        tmp = bindir / f".pytest.{_secrets.token_hex(4)}"
        tmp.symlink_to(real)
        tmp.replace(link)
    return bindir


def _verifier_env(trial: Trial, tests: Path, vdir: Path, tag: str) -> dict[str, str]:
    bindir = _verifier_bin(trial.dir.parent.parent)
    return {**trial.task.verifier_env,
            "PATH": f"{bindir}:{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(vdir),
            "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            # only the CTRF plugin: no entry-point plugin an agent (or a stray package) provides,
            # and 3x faster start-up on a loaded host
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_PLUGINS": "ctrf.main",
            "T1_WORKSPACE": str(trial.workspace),
            "T1_TESTS_DIR": str(tests), "T1_CTRF_PATH": str(vdir / "ctrf.json"), "T1_RUN_TAG": tag}


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


def verify(trial: Trial, *, limits: Limits = VERIFIER_LIMITS, scale: float = 20.0) -> VerifierResult:
    """Run the task's verifier on a finished trial and compute its reward (see module doc)."""
    if trial.verified:
        raise TrialDirError(f"trial {trial.trial_id} was already verified; a verdict is final",
                            trial_id=trial.trial_id)
    t_start = time.monotonic()
    trial.verified = True
    trial.finish()
    tag = run_tag_for(trial)
    events = scan_for_tampering(trial)
    for name in ("tests", "verifier"):
        _quarantine(trial.dir / name)
    tests = _install_tests(trial)
    vdir = trial.dir / "verifier"
    vdir.mkdir(mode=0o755)
    (vdir / "run_tag").write_text(tag + "\n")
    os.chmod(vdir / "run_tag", 0o444)
    uid = trial.isolation.verifier_uid
    if uid is not None:
        os.chown(vdir, uid, uid)
    if events:   # a forgery voids the trial: run nothing the agent may have prepared
        return _finish(trial, tag, vdir, events, None, t_start, scale)
    t0_ms = time.time() * 1000
    out = run_limited(["/bin/bash", str(tests / "test.sh")], cwd=trial.workspace,
                      env=_verifier_env(trial, tests, vdir, tag), limits=limits,
                      timeout_s=trial.task.verifier_timeout_s, log_dir=trial.dir / "logs",
                      marker=f"{trial.trial_id}:verifier", isolation=trial.isolation, uid=uid,
                      secrets=trial.secrets)
    t1_ms = time.time() * 1000
    events += _post_checks(trial, tests)
    if events:
        return _finish(trial, tag, vdir, events, out, t_start, scale)
    reward, reason = _reward(trial, vdir, tag, t0_ms, t1_ms, out, events, scale)
    return _finish(trial, tag, vdir, events, out, t_start, scale, reward, reason)


def _finish(trial: Trial, tag: str, vdir: Path, events: list[TamperEvent], out: ExecResult | None,
            t_start: float, scale: float, reward: RewardResult | None = None,
            reason: str = "tamper") -> VerifierResult:
    if reward is None or events:
        kinds = ",".join(sorted({e.kind for e in events}))
        base = ctrf_reward(None, solved=False, scale=scale)
        reward, reason = dataclasses.replace(base, source=f"tamper:{kinds}"), "tamper"
    for ev in events:
        log.warning("tamper event in trial %s: %s at %s (%s)", ev.trial_id, ev.kind, ev.path, ev.detail)
    result = VerifierResult(trial.trial_id, tag, reward, tuple(events),
                            None if out is None else out.exit_code, reason,
                            time.monotonic() - t_start, out)
    _write_result(vdir, result)
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
    reward = decide(doc, problem, vdir, since_s=t0_ms / 1000, scale=scale)
    if out.limit_hit:
        return reward, out.reason
    return reward, "no-verdict" if reward.source == SOURCE_NO_VERDICT else "ok"


def _write_result(vdir: Path, result: VerifierResult) -> None:
    payload = {"run_tag": result.run_tag, "trial_id": result.trial_id, "reason": result.reason,
               "reward": dataclasses.asdict(result.reward) if dataclasses.is_dataclass(result.reward)
               else str(result.reward), "exit_code": result.exit_code,
               "tamper_events": [dataclasses.asdict(e) for e in result.tamper_events]}
    (vdir / "result.json").write_text(json.dumps(payload, indent=1, default=str))


def read_verifier_result(trial_dir: str | Path, run_tag: str) -> dict[str, Any]:
    """A trial's recorded verdict, refused unless it carries ``run_tag`` (never a stale one)."""
    path = Path(trial_dir) / "verifier" / "result.json"
    try:
        payload = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ParseError(f"{path}: no readable verifier result ({e})", source=str(path)) from e
    found = payload.get("run_tag") if isinstance(payload, dict) else None
    if found != run_tag:
        raise TrialDirError(f"{path}: result carries run tag {found!r}, expected {run_tag!r}; "
                            "refusing another run's reward", path=str(path), found=found,
                            expected=run_tag)
    return payload
