"""`t1ops tasks run`: each task with its reference solution (or no agent action), then its verifier.

For every task dir given (or every task in a pool dir) the local environment backend
is checked first (rl/agent/environment.py); a task it cannot run is reported with the
reason and not started. Otherwise a trial is created in the sandbox, ``--oracle`` runs
``bash /solution/solve.sh`` with ``[solution.env]`` (as Harbor's oracle agent does),
and the verifier decides the reward (rl/agent/verdict.py). Progress goes to stderr,
results to stdout (a table, or ``--json``: one object per task). docs/tasks.md.
"""
from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rl.agent.bounded import printable
from rl.agent.container import diagnose
from rl.agent.environment import LOCAL, Environment
from rl.agent.tasks import Task, inspect_task
from rl.agent.verdict import is_solved
from rl.errors import T1OpsError
from t1ops.task_import import backend_named, task_dirs

ORACLE_SCRIPT = "/solution/solve.sh"


def _row(task: str, **kw) -> dict:
    """One result row; its text is printable (a reason may quote what a trial printed: #51)."""
    row = {"task": task, "reward": None, "source": "not-run", "passed": None, "total": None,
           "solved": False, "duration_s": 0.0, "reason": "", **kw}
    return {k: printable(v) if isinstance(v, str) else v for k, v in row.items()}


def oracle_command(task: Task) -> str:
    """``env K=V ... bash /solution/solve.sh`` with the task's ``[solution.env]``."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(task.solution_env.items()))
    return f"env {exports} bash {ORACLE_SCRIPT}" if exports else f"bash {ORACLE_SCRIPT}"


def run_one(task: Task, sandbox, idx: int, *, oracle: bool, scale: float = 20.0) -> dict:
    """Run ``task`` once in ``sandbox`` (see module doc); never raises for what the task does."""
    from rl.agent.verifier import verify_within

    t0 = time.monotonic()
    if oracle and task.solution is None:
        return _row(task.name, reason="no solution/solve.sh: nothing to run with --oracle")
    trial = sandbox.create(task, idx, oracle=oracle)
    try:
        ran = trial.exec(oracle_command(task), timeout_s=task.agent_timeout_s) if oracle else None
        trial.finish()
        verdict = verify_within(trial, scale=scale)   # a wall-clock bound whatever the verifier does
    finally:
        close = getattr(trial, "close", None)
        if close is not None:
            close()
    r = verdict.reward
    reasons = [f"solution: needs a host it cannot reach ({u})" for u in [unreachable(ran)] if u]
    if ran is not None and ran.reason != "ok":
        reasons.append(f"solution {ran.reason} (exit {ran.exit_code})")
    if not is_solved(r):   # a reward 0 from test.sh's own `echo 0` hides why as well as no verdict
        out = getattr(verdict, "output", None)
        reasons += [f"verifier: {why}" for why in
                    diagnose.verifier_reasons(*((out.stdout, out.stderr) if out else ("", "")))]
    if verdict.reason != "ok":
        reasons.append(f"verifier {verdict.reason}" + (f": {r.detail}" if r.detail else ""))
    return _row(task.name, reward=r.value, source=r.source, passed=r.passed, total=r.total,
                solved=is_solved(r), duration_s=round(time.monotonic() - t0, 2),
                reason="; ".join(reasons) or "ok", trial=trial.trial_id)


def unreachable(ran) -> str:
    """The first output line of ``ran`` (an exec result) saying a host was unreachable."""
    return diagnose.unreachable(ran.stdout, ran.stderr) if ran is not None else ""


def run_paths(paths: list[Path], *, oracle: bool, allow_internet: bool = False,
              trials_root: Path | None = None, backend: str = "local", scale: float = 20.0) -> list[dict]:
    """One result row per task found under ``paths`` (module doc)."""
    from rl.agent.sandbox import Sandbox

    dirs = [d for p in paths for d in (task_dirs(p) or [p])]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="t1ops-tasks-run-") as tmp:
        root = (trials_root or Path(tmp)).resolve()
        sandbox = Sandbox(root, f"tasks-run-{uuid.uuid4().hex[:8]}", allow_internet=allow_internet,
                          backend=backend)
        for i, d in enumerate(dirs, 1):
            print(f"[{i}/{len(dirs)}] {d.name} ...", file=sys.stderr, flush=True)
            rows.append(_run_dir(d, sandbox, i, oracle=oracle, allow_internet=allow_internet,
                                 env_backend=backend_named(backend), scale=scale))
            rows[-1]["scale"] = scale
            row = rows[-1]
            print(f"[{i}/{len(dirs)}] {d.name}: reward {row['reward']} ({row['source']}) "
                  f"{row['reason']}", file=sys.stderr, flush=True)
    return rows


def _run_dir(d: Path, sandbox, idx: int, *, oracle: bool, allow_internet: bool,
             env_backend: Environment = LOCAL, scale: float = 20.0) -> dict:
    from rl.agent.container.images import ImageBuildError
    from rl.agent.container.mcp import McpNotReady

    check = inspect_task(d)
    if check.task is None:
        return _row(d.name, reason="; ".join(check.problems))
    env = env_backend.check(check.task, allow_internet=allow_internet)
    if not env.runs_locally:
        return _row(d.name, reason="; ".join(env.needs))
    try:
        return run_one(check.task, sandbox, idx, oracle=oracle, scale=scale)
    except ImageBuildError as e:   # a named verdict, never a crash: reward 0, no trial ran
        return _row(d.name, reward=0.0, source="build-failed", reason=f"build-failed: {e}")
    except McpNotReady as e:
        return _row(d.name, reward=0.0, source="mcp-not-ready", reason=f"mcp-not-ready: {e}")
    except T1OpsError as e:
        return _row(d.name, reason=f"{type(e).__name__}: {e}")


def print_rows(rows: list[dict], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows)
    solved = sum(r["solved"] for r in rows)
    no_verdict = sum(r["source"] == "no-verdict" for r in rows)
    not_run = sum(r["reward"] is None for r in rows)
    sys.stdout.flush()
    print(f"{len(rows)} tasks: {solved} solved, {no_verdict} no-verdict, {not_run} not run",
          file=sys.stderr)
    scale = rows[0].get("scale", 20.0) if rows else 20.0
    print(f"reward = passed tests / S with S = {scale:g} (--scale; a campaign's rollout.reward_scale, the "
          "report's S = 20): a solved 4-test task scores 4/S; 'solved' means every test passed", file=sys.stderr)


def _print_table(rows: list[dict]) -> None:
    print(f"{'task':<28} {'reward':>7} {'=passed/S':>9} {'source':<14} {'passed':>7} {'secs':>6}  reason")
    for r in rows:
        reward = "-" if r["reward"] is None else f"{r['reward']:.3f}"
        of_s = "-" if r["passed"] is None else f"{r['passed']}/{r.get('scale', 20.0):g}"
        passed = "-" if r["total"] is None else f"{r['passed']}/{r['total']}"
        print(f"{r['task']:<28} {reward:>7} {of_s:>9} {r['source']:<14} {passed:>7} {r['duration_s']:>6.1f}  "
              f"{r['reason']}")
