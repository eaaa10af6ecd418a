"""Small process helpers the scenarios share."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def start_campaign(args: list[str], log: Path, *, append: bool = False,
                   entry: tuple[str, ...] = ("t1ops.cli", "run")) -> subprocess.Popen:
    """``t1ops run ARGS --no-progress`` as a process of its own session (a SIGKILL of the session
    takes Ray and the engines with it), output to ``log``; this checkout first on the path. ``entry``:
    the module and its first arguments (``("chaos.critic_skip", "3")``: the run with that fault)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", *entry, *args, "--no-progress"], cwd=REPO, env=env,
                            stdout=open(log, "a" if append else "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_stopped(pid: int, limit_s: float = 10.0) -> bool:
    """True once ``pid`` is in the stopped state. SIGSTOP is delivered asynchronously: on a loaded
    machine /proc can still say 'running' right after ``kill()`` returns, so observe the stop
    rather than read the state once."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            return True
        time.sleep(0.01)
    return False


def session_processes(proc: subprocess.Popen) -> list[psutil.Process]:
    """The live processes of the session ``proc`` leads (Ray, workers, engines), by pid."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and os.getsid(p.pid) == proc.pid:
                out.append(p)
        except (ProcessLookupError, psutil.Error, PermissionError):
            continue
    return out


def end_session(proc: subprocess.Popen) -> int:
    """Kill ``proc`` and what is left of the session it leads (Ray, engines), by pid; how many were left."""
    if proc.poll() is None:
        proc.kill()
    killed = 0
    for p in session_processes(proc):
        try:
            p.kill()
            killed += 1
        except psutil.Error:
            continue
    return killed


def event_since(run_dir: Path, name: str, after: float, step: int | None = None) -> float | None:
    """Seconds from ``after`` (wall clock) to the first ``name`` event (of ``step`` if given) any process of
    the campaign in ``run_dir`` wrote after it (``telemetry/**/events.jsonl``); None if there is none."""
    times = []
    for path in sorted((run_dir / "telemetry").rglob("events.jsonl")) if (run_dir / "telemetry").is_dir() else ():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line being written
                continue
            if rec.get("name") == name and rec.get("time", 0) > after and (step is None or rec.get("step") == step):
                times.append(rec["time"])
    return min(times) - after if times else None
