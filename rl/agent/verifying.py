"""Verifiers in flight, named where a stalled step is diagnosed (catalogue id slow-verifier).

verl issue #6673: a slow reward function looked like an NCCL deadlock: the trainer's stack
sat in a collective while the real culprit, a reward computation, ran on. Here every
verifier run leaves an entry beside its trial dirs (``<trials>/<run>/.verifying/<trial>.json``:
task, trial, run tag, the worker's pid, start and budget) for as long as it runs, and the pids
of the verifier's own processes once they exist. They are found by the run tag in their
environment (``T1_RUN_TAG``, set for every verifier; a container client carries it on its
command line), so the lookup is the same on both backends. A stall report reads the entries
(:func:`in_flight`) and names the verifier: task, trial, pid, seconds run of its budget.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import psutil

REGISTRY = ".verifying"
RESOLVE_EVERY_S = 0.5   # look for the verifier's processes this often until they are seen (a jail starts in
                        # milliseconds on an idle host, seconds on a loaded one)


def verifier_pids(tag: str) -> list[int]:
    """Pids of this host's processes that run the verifier tagged ``tag`` (environment or argv)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(tag in a for a in (p.info["cmdline"] or ())) or p.environ().get("T1_RUN_TAG") == tag:
                found.append(p.info["pid"])
        except (psutil.Error, OSError):
            continue   # gone, or not ours to read
    return sorted(found)


class Entry:
    """The registry entry of one running verifier (a context manager around the run)."""

    def __init__(self, trials_dir: Path, task: str, trial_id: str, tag: str, budget_s: float) -> None:
        self.path = Path(trials_dir) / REGISTRY / f"{trial_id}.json"
        self.doc = {"task": task, "trial_id": trial_id, "run_tag": tag, "worker_pid": os.getpid(),
                    "started": time.time(), "budget_s": budget_s, "pids": []}
        self._done = threading.Event()
        self._resolver = threading.Thread(target=self._resolve_until_seen, daemon=True, name="verifier-pids")

    def resolve(self) -> list[int]:
        """Look the verifier's processes up now and record them."""
        pids = [p for p in verifier_pids(self.doc["run_tag"]) if p != os.getpid()]
        if pids:
            self.doc["pids"] = pids
            self._write()
        return self.doc["pids"]

    def _resolve_until_seen(self) -> None:
        while not self._done.wait(RESOLVE_EVERY_S):
            try:
                if self.resolve():
                    return
            except OSError:   # the registry dir went with the trial: nothing left to name
                return

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc))
        os.replace(tmp, self.path)   # a reader sees the old or the new entry, never half of one

    def __enter__(self) -> "Entry":
        self.path.parent.mkdir(mode=0o755, exist_ok=True)
        self._write()
        self._resolver.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._resolver.join(timeout=5)
        self.path.unlink(missing_ok=True)


def in_flight(trials_root: Path, now: float | None = None) -> list[dict]:
    """Every verifier running under ``trials_root`` (its run dirs, or a run dir itself), oldest
    first, each with ``elapsed_s``."""
    now = time.time() if now is None else now
    root = Path(trials_root)
    out = []
    for path in [*root.glob(f"{REGISTRY}/*.json"), *root.glob(f"*/{REGISTRY}/*.json")]:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue   # finished (removed) while we looked
        out.append({**doc, "elapsed_s": round(now - doc["started"], 3)})
    return sorted(out, key=lambda d: d["started"])


def describe(entry: dict) -> str:
    """One line naming a running verifier."""
    pids = ",".join(map(str, entry.get("pids") or [])) or f"not yet seen; worker pid {entry['worker_pid']}"
    return (f"verifier of task {entry['task']}, trial {entry['trial_id']} (pid {pids}) running "
            f"{entry['elapsed_s']:.1f} s of its {entry['budget_s']:g} s budget")
