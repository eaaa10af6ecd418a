"""Find and follow runs (`t1ops runs`; docs/getting-started.md, "Find and follow runs").

A run directory says what it is in ``status.json``, which ``t1ops run`` writes as it starts
(``running``, with its pid and host), as it returns (``finished``) and as it fails (``crashed``,
with the error). A ``running`` run whose process is gone from this host died without a word (a
kill, an OOM): it is ``crashed``. Directories from before ``status.json`` are judged by their
``summary.json``. A crashed run is ``resumable`` when its checkpoints hold a step at which actor,
critic and trainer state all verify (``t1ops.campaign.resume.plan_resume``): ``t1ops run CONFIG
--resume RUN``.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from t1ops.errors import ConfigError

STATUS_FILE = "status.json"


def mark(run_dir: Path, state: str, **info) -> None:
    """Record the run's state (``running``, ``finished`` or ``crashed``) in ``status.json``."""
    from t1ops.campaign.summary import write_json_atomic

    write_json_atomic(Path(run_dir) / STATUS_FILE, {"state": state, "pid": os.getpid(), "host": socket.gethostname(),
                                                    "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **info})


@dataclass
class RunState:
    path: Path
    status: str              # running, finished, crashed, crashed (resumable from step N), unknown
    last_step: int | None
    steps: int | None        # run.steps
    reward: float | None     # the last step's mean reward
    eval_reward: float | None
    detail: str = ""

    @property
    def resumable(self) -> bool:
        return self.status.startswith("crashed") and "resumable" in self.status and "not" not in self.status


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_run_dir(path: Path) -> bool:
    """A directory `t1ops run` made: its config.json is a campaign's (a model's config.json is not)."""
    config = _read_json(path / "config.json") if (path / "config.json").is_file() else None
    return isinstance(config, dict) and "run" in config and "rollout" in config


def state_of(path: Path) -> RunState:
    """The state of one run directory (see the module docstring)."""
    config = _read_json(path / "config.json") or {}
    summary = _read_json(path / "summary.json") or {}
    rows = summary.get("steps") or []
    evals = summary.get("eval") or []
    steps = (config.get("run") or {}).get("steps")
    last = rows[-1]["step"] if rows else None
    status_doc = _read_json(path / STATUS_FILE)
    detail = ""
    if status_doc is not None:
        state = status_doc.get("state", "unknown")
        if state == "running" and status_doc.get("host") == socket.gethostname() \
                and not _alive(int(status_doc.get("pid", 0))):
            state, detail = "crashed", f"its process {status_doc.get('pid')} is gone (killed?)"
        elif state == "running" and status_doc.get("host") != socket.gethostname():
            detail = f"on host {status_doc.get('host')}"
        detail = detail or status_doc.get("error", "")
    else:  # a run from before status.json
        state = "finished" if last is not None and steps is not None and last >= steps else "crashed"
        written = path / "summary.json"
        if state == "crashed" and written.exists() and time.time() - written.stat().st_mtime < 120:
            state = "running"  # written a moment ago: most likely still going
    if state == "crashed":
        state = _resume_state(path, config)
    return RunState(path, state, last, steps, rows[-1].get("reward_mean") if rows else None,
                    evals[-1].get("eval_reward_mean") if evals else None, detail)


def _resume_state(path: Path, config: dict) -> str:
    from t1ops.campaign.resume import plan_resume
    from t1ops.errors import T1OpsError

    try:
        point = plan_resume(path / "checkpoints", needs_critic=(config.get("trainer") or {}).get("mode") == "ppo")
    except T1OpsError:
        return "crashed (not resumable: no verified checkpoint)"
    return f"crashed (resumable from step {point.step})"


def list_runs(root: Path) -> list[RunState]:
    """Every run directory directly under ``root`` (or ``root`` itself), oldest first."""
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory (resolved to {root.absolute()}); runs live under "
                          "run.out_dir (default: runs/ in the directory you ran `t1ops run` from)", path=str(root))
    dirs = [root] if is_run_dir(root) else sorted((p for p in root.iterdir() if p.is_dir() and is_run_dir(p)),
                                                  key=lambda p: (p / "config.json").stat().st_mtime)
    return [state_of(p) for p in dirs]


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def render(states: list[RunState], root: Path) -> str:
    if not states:
        return f"no runs under {root} (a run directory holds config.json; start one with `t1ops run CONFIG`)"
    head = f"{'RUN':40s} {'STATUS':48s} {'STEP':>9s} {'REWARD':>7s} {'EVAL':>7s}"
    lines = [head]
    for s in states:
        step = f"{'-' if s.last_step is None else s.last_step}/{'-' if s.steps is None else s.steps}"
        lines.append(f"{s.path.name:40s} {s.status:48s} {step:>9s} {_fmt(s.reward):>7s} {_fmt(s.eval_reward):>7s}"
                     + (f"  {s.detail}" if s.detail else ""))
    resumable = [s for s in states if s.resumable]
    if resumable:
        lines.append(f"resume one: t1ops run CONFIG --resume {resumable[-1].path}")
    lines.append(f"follow one: t1ops runs tail {states[-1].path}")
    return "\n".join(lines)


def find_run(name: str, root: Path = Path("runs")) -> Path:
    """A run directory from a path or a run id (or its unique prefix) under ``root``."""
    path = Path(name)
    if is_run_dir(path):
        return path
    matches = sorted(p for p in root.glob(f"{name}*") if is_run_dir(p)) if root.is_dir() else []
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ConfigError(f"{name!r} matches {len(matches)} runs under {root}: "
                          + ", ".join(p.name for p in matches[:5]), path=name)
    raise ConfigError(f"{name} is not a run directory (no config.json at {path.absolute()}) and no run under "
                      f"{root.absolute()} starts with it; list them with `t1ops runs [DIR]`", path=name)


def step_line(row: dict) -> str:
    from t1ops.campaign.progress import row_text

    return row_text(row)


def tail(path: Path, *, out: TextIO = sys.stdout, lines: int = 10, follow: bool = True, poll_s: float = 2.0,
         sleep: Callable[[float], None] = time.sleep) -> RunState:
    """Print the run's last ``lines`` step lines and evaluations, then each new one as summary.json
    gains it, until the run is no longer running (``follow``); returns its final state."""
    seen_steps, seen_evals = 0, 0
    first = True
    while True:
        summary = _read_json(path / "summary.json") or {}
        rows, evals = summary.get("steps") or [], summary.get("eval") or []
        if first:
            seen_steps, seen_evals = max(0, len(rows) - lines), max(0, len(evals) - lines)
            first = False
        new = [(r["step"], 0, step_line(r)) for r in rows[seen_steps:]]
        new += [(e["step"], 1, f"eval@{e['step']} reward {_fmt(e.get('eval_reward_mean'))} +- "
                               f"{_fmt(e.get('eval_reward_sem'))} solved "
                               f"{_fmt(100 * (e.get('eval_solved_share') or 0), '.0f')}% n {e.get('eval_num_trials', '-')}")
                for e in evals[seen_evals:]]
        for _, _, text in sorted(new):
            print(text, file=out, flush=True)
        seen_steps, seen_evals = len(rows), len(evals)
        state = state_of(path)
        if not follow or state.status != "running":
            print(f"{path.name}: {state.status}" + (f" at step {state.last_step}/{state.steps}"
                                                     if state.last_step is not None else "")
                  + (f" ({state.detail})" if state.detail else ""), file=out, flush=True)
            return state
        sleep(poll_s)
