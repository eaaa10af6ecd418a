"""Starting an embedded engine process (:mod:`rl.engines.embedded`) and waiting for its health.

This module imports neither torch nor the model, so a process that only launches engines (the
campaign's ``EngineRouter``) does not pay their import (about 1.7 CPU-s; docs/testing.md).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl.engines import protocol as P
from rl.errors import EngineError

if TYPE_CHECKING:
    from rl.model import ModelSpec


def spawn(port: int, spec: ModelSpec | Mapping[str, Any], *, checkpoint: str | Path | None = None, vocab_path: str | Path | None = None,
          dtype: str = "bf16", seed: int = 0, host: str = "127.0.0.1", startup_timeout_s: float = 180.0,
          log_path: str | Path | None = None, batching: bool = True, batch_invariant: bool = False,
          extra_args: list[str] | None = None, emission_dir: str | Path | None = None) -> subprocess.Popen:
    """Start an engine process and return it once ``GET /health`` answers 200.

    The process's base URL is set as ``proc.url``. Output goes to
    ``log_path`` (else discarded). ``extra_args`` are more serve flags (e.g. the chaos
    harness's ``--chaos --chaos-omit-routing-for RID_REGEX``). ``spec`` is a ``ModelSpec`` or its
    fields (``ModelSpec.to_dict()``); the engine process validates them. Raises EngineError (and kills the child)
    if it exits or stays unhealthy past ``startup_timeout_s``.
    """
    fields = dict(spec) if isinstance(spec, Mapping) else spec.to_dict()
    command = [sys.executable, "-m", "rl.engines.embedded", "--host", host, "--port", str(port),
               "--spec-json", json.dumps(fields), "--dtype", dtype, "--seed", str(seed)]
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    if vocab_path is not None:
        command += ["--vocab", str(vocab_path)]
    if not batching:
        command.append("--recompute")
    if batch_invariant:
        command.append("--batch-invariant")
    if emission_dir is not None:  # the engine's own record of emitted ids, one file per engine process
        command += ["--emission-log", str(Path(emission_dir) / f"engine-{port}-{os.getpid()}-{time.time_ns()}.jsonl")]
    command += list(extra_args or [])
    log = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[2])
    finally:
        if log_path is not None:
            log.close()  # the child holds its own descriptor
    proc.url = f"http://{host}:{port}"
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineError(f"embedded engine on port {port} exited with {proc.returncode} during startup"
                              + (f"; see {log_path}" if log_path else ""), port=port, returncode=proc.returncode)
        try:
            with urllib.request.urlopen(proc.url + P.HEALTH, timeout=2.0) as resp:
                if resp.status == 200:
                    return proc
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise EngineError(f"embedded engine on port {port} not healthy after {startup_timeout_s} s", port=port,
                      startup_timeout_s=startup_timeout_s)
