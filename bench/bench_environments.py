"""Per-trial overhead of the two environment backends, and the image cache, in one run.

    python bench/bench_environments.py [--trials 5]

For the bundled task ``text-sort`` (examples/tasks: no Dockerfile, so the container backend
uses its shared default image, ``python:3.12-slim`` + pytest, a stand-in on registry-less
hosts), each trial is: create, two agent commands (the oracle's ``solve.sh`` and ``ls``),
verify (its pytest + CTRF verifier), close. The bench times ``--trials`` such trials per backend (after one warm-up trial each)
and prints the median seconds per trial and the ratio container / local. Then the image
cache: the vendored Harbor task ``hello-world``'s Dockerfile with a fresh marker line is built
once (a miss: the build runs) and again (a hit: a content-addressed lookup), and the bench
prints both and their ratio. Needs root and the container runtime (scripts/setup-container-runtime.sh).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from rl.agent.container import images
from rl.agent.sandbox import Sandbox
from rl.agent.tasks import load_task
from rl.agent.verifier import verify
from t1ops.task_runs import oracle_command

REPO = Path(__file__).resolve().parent.parent
TASK = REPO / "examples" / "tasks" / "text-sort"
BUILD_TASK = REPO / "tests" / "fixtures" / "harbor" / "container" / "hello-world"


def one_trial(sandbox: Sandbox, task, idx: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    trial = sandbox.create(task, idx, oracle=True)
    try:
        assert trial.exec(oracle_command(task)).reason == "ok"
        assert trial.exec("ls").reason == "ok"
        v = verify(trial)
    finally:
        trial.close()
    assert v.reason == "ok" and v.reward.passed == v.reward.total, v
    return time.perf_counter() - t0, v.reward.value


def per_trial(backend: str, root: Path, trials: int) -> float:
    task = load_task(TASK)
    sandbox = Sandbox(root / backend, f"bench-{backend}", backend=backend)
    one_trial(sandbox, task, 0)                    # warm-up (the container image build, caches)
    return statistics.median(one_trial(sandbox, task, i + 1)[0] for i in range(trials))


def build_miss_hit(root: Path) -> tuple[float, float]:
    src = root / "pool" / "hello-world-bench"
    shutil.copytree(BUILD_TASK, src)
    with open(src / "environment" / "Dockerfile", "a") as f:
        f.write(f"RUN echo {uuid.uuid4().hex} > /etc/t1ops-bench-marker\n")   # new content: a miss
    task = load_task(src)
    t0 = time.perf_counter()
    miss = images.build(task)
    t1 = time.perf_counter()
    hit = images.build(task)
    t2 = time.perf_counter()
    assert not miss.cached and hit.cached and hit.tag == miss.tag
    from rl.agent.container import runtime
    runtime.podman("rmi", "-f", miss.tag, check=False)
    return t1 - t0, t2 - t1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="t1ops-bench-env-") as tmp:
        root = Path(tmp)
        local = per_trial("local", root, args.trials)
        container = per_trial("container", root, args.trials)
        miss, hit = build_miss_hit(root)
    print(f"per trial (create, 2 execs, verify, close), median of {args.trials}:")
    print(f"  local      {local:7.3f} s")
    print(f"  container  {container:7.3f} s")
    print(f"  ratio container/local: {container / local:.2f}x")
    print("image build of the same task (new content, then again):")
    print(f"  cache miss {miss:7.3f} s")
    print(f"  cache hit  {hit:7.3f} s")
    print(f"  ratio miss/hit: {miss / hit:.0f}x")


if __name__ == "__main__":
    main()
