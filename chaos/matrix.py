"""The combination matrix: run mode x trainer layout x weight sync, each cell killed and resumed.

    python -m chaos.matrix                      # all 30 cells; prints the table
    python -m chaos.matrix --pairwise           # the pairwise cover (every pair of values in a cell): 15
    python -m chaos.matrix --markdown docs/matrix.md

Every cell is the tiny campaign (examples/tiny/campaign.toml) set with ``--set`` to 2 steps, the
smallest batches, no supervised warm start (a cell checks the path, not the policy) and held-out
evaluation every step, run as its own ``t1ops run`` process,
SIGKILLed once step 1 is recorded and step 2 is training, then ``--resume``d: the cell passes when
the resumed run ends with steps [1, 2] once each, and evaluations of steps 0..2. A cell the
code refuses fails the matrix unless its refusal is one of :data:`PHYSICS` (a reason of physics,
named in the error), so a refusal of code cannot hide here. The table is docs/matrix.md.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos.procs import end_session, start_campaign

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "examples" / "tiny" / "campaign.toml"
MODES = ("sync", "one_step", "fully_async")
TRAINERS = {"1 rank": [], "dp=2": ["trainer.parallel.dp=2"],
            "tp=2+ep=2": ["trainer.parallel.tp=2", "trainer.parallel.ep=2", "trainer.parallel.sequence_parallel=true"],
            # the report's levers (docs/parallelism.md): two pipeline stages of the tiny model's 2 layers, and
            # every sample's tokens zig-zag sliced over two context-parallel ranks
            "pp=2": ["trainer.parallel.pp=2"], "cp=2": ["trainer.parallel.cp=2"]}
SYNCS = ("disk", "distributed")
# Refusals that are physics, not code (none today: every combination runs on this host).
PHYSICS: tuple[str, ...] = ()
SMALL = ["run.steps=2", "run.num_cpus=2", "trainer.warm_start_steps=0", "trainer.ppo_epochs=1",
         "trainer.save_every=1", "rollout.batch_size=4", "rollout.n_samples_per_prompt=2", "rollout.max_turns=1",
         "rollout.max_new_tokens=16", "fully_async.num_parallel_generation_workers=4",
         "fully_async.zero_variance_filter=false", "eval.every_steps=1", "eval.samples_per_task=1",
         "eval.tasks=['count-0016']"]
RUN_TIMEOUT_S = 900


@dataclass(frozen=True)
class Cell:
    mode: str
    trainer: str
    sync: str

    def overrides(self) -> list[str]:
        return [*SMALL, f"run.mode={self.mode}", *TRAINERS[self.trainer], f"engine.weight_sync={self.sync}"]


# Cells a chaos scenario already runs killed and resumed with held-out eval on, asserting more than a
# cell does: the test suite runs the scenario, not the cell a second time (`python -m chaos.matrix`
# still runs every cell). tests/chaos/test_matrix.py checks the scenario's overrides make the cell.
STANDS_IN = {Cell("fully_async", "dp=2", "distributed"): "coordinator-crash",   # chaos/scenarios/coordinator_crash.py
             Cell("sync", "1 rank", "disk"): "verify-recovery"}                 # chaos/recovery.py


@dataclass
class Result:
    cell: Cell
    ok: bool
    detail: str
    steps: list[int] = field(default_factory=list)
    evals: list[int] = field(default_factory=list)
    seconds: float = 0.0
    run_dir: Path | None = None  # the killed-and-resumed run, for checks of its own outputs


def full_matrix() -> list[Cell]:
    return [Cell(m, t, s) for m, t, s in itertools.product(MODES, TRAINERS, SYNCS)]


def pairwise() -> list[Cell]:
    """15 cells covering every pair of values (mode x trainer in full; weight sync alternating so
    that every mode and every trainer meets both syncs)."""
    trainers = list(TRAINERS)
    return [Cell(m, t, SYNCS[(i + j) % 2]) for i, m in enumerate(MODES) for j, t in enumerate(trainers)]


def covers_all_pairs(cells: list[Cell]) -> bool:
    axes = (MODES, tuple(TRAINERS), SYNCS)
    for a, b in itertools.combinations(range(3), 2):
        want = set(itertools.product(axes[a], axes[b]))
        got = {((c.mode, c.trainer, c.sync)[a], (c.mode, c.trainer, c.sync)[b]) for c in cells}
        if want - got:
            return False
    return True




def run_cell(cell: Cell, tmp: Path) -> Result:
    """Crash the cell's campaign during step 2, resume it, check the rows and the evaluations."""
    from chaos.scenarios.coordinator_crash import _submitted, _summary

    args = [str(BASE), *[a for o in cell.overrides() for a in ("--set", o)]]
    t0, out = time.monotonic(), tmp / "runs"
    proc = start_campaign([*args, "--out", str(out)], tmp / "crash.log")
    run_dir, killed = None, False
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            dirs = [d for d in out.iterdir() if d.is_dir()] if out.is_dir() else []
            run_dir = dirs[0] if dirs else None
            if run_dir and len(_summary(run_dir)["steps"]) == 1 and _submitted(run_dir, 2):
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.02)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        end_session(proc)
    if not killed or run_dir is None:
        text = (tmp / "crash.log").read_text()[-600:]
        physics = next((p for p in PHYSICS if p in text), None)
        return Result(cell, physics is not None, f"refused (physics: {physics})" if physics else
                      f"no kill mid-step 2 (rc {proc.returncode}): {text[-300:]}", seconds=time.monotonic() - t0)
    resume = start_campaign([*args, "--resume", str(run_dir)], tmp / "resume.log")
    try:
        rc = resume.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        resume.kill()
        rc = -999
    finally:
        end_session(resume)
    s = _summary(run_dir)
    steps, evals = [r["step"] for r in s["steps"]], sorted({e["step"] for e in s.get("eval", [])})
    ok = rc == 0 and steps == [1, 2] and evals == [0, 1, 2] and bool(s.get("resumes"))
    detail = "killed in step 2, resumed" if ok else f"resume rc {rc}: {(tmp / 'resume.log').read_text()[-300:]}"
    return Result(cell, ok, detail, steps, evals, time.monotonic() - t0, run_dir)


def table(results: list[Result]) -> str:
    rows = ["| mode | trainer | weight sync | result | steps | evals | s |", "|---|---|---|---|---|---|---|"]
    for r in results:
        c = r.cell
        rows.append(f"| {c.mode} | {c.trainer} | {c.sync} | {'ok' if r.ok else 'FAIL'}: {r.detail.replace('|', '/')} "
                    f"| {r.steps} | {r.evals} | {r.seconds:.0f} |")
    return "\n".join(rows) + "\n"


def write_results(path: Path, text: str) -> None:
    """Put the table under the ``## Results`` heading of ``path``, keeping the prose around it."""
    doc = path.read_text() if path.exists() else ""
    head, sep, rest = doc.partition("## Results\n")
    if not sep:
        path.write_text(doc + ("\n" if doc else "") + "## Results\n\n" + text)
        return
    nxt = rest.find("\n## ")
    path.write_text(head + sep + "\n" + text + (rest[nxt:] if nxt >= 0 else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.matrix", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairwise", action="store_true", help="the pairwise cover only (15 cells)")
    p.add_argument("--markdown", type=Path, help="write the table here")
    p.add_argument("--json-out", type=Path, help="write the results as JSON here")
    p.add_argument("--jobs", type=int, default=1,
                   help="cells run at once (default 1; each cell is two campaign processes in turn)")
    args = p.parse_args(argv)
    cells = pairwise() if args.pairwise else full_matrix()

    def one(cell: Cell) -> Result:
        with tempfile.TemporaryDirectory(prefix="t1ops-matrix-") as tmp:
            r = run_cell(cell, Path(tmp))
        print(table([r]).splitlines()[-1], flush=True)
        return r

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(one, cells))  # in matrix order, whatever order they finish in
    text = table(results)
    print(text + f"{sum(r.ok for r in results)}/{len(results)} cells ok in {time.monotonic() - t0:.0f} s "
                 f"({args.jobs} at a time)")
    if args.markdown:
        write_results(args.markdown, text)
    if args.json_out:
        args.json_out.write_text(json.dumps([{**r.cell.__dict__, "ok": r.ok, "detail": r.detail, "steps": r.steps,
                                              "evals": r.evals, "seconds": r.seconds} for r in results], indent=1))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
