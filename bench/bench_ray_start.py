"""What a campaign's Ray start-up costs in CPU, with and without a job-level ``runtime_env``.

    python bench/bench_ray_start.py [--actors 6] [--rounds 2]

Each run is a fresh process that starts a local Ray cluster the way a campaign does
(``t1ops.campaign.launch._init_ray``), creates ``--actors`` actors, calls each once and shuts
down; the CPU seconds of the whole process tree (driver, GCS, raylet, Ray's agents, every worker)
are summed from psutil samples every 50 ms. "runtime_env" is the same start with the job-level
``runtime_env`` a campaign passes to a cluster it did not start (env vars plus the nofile hook,
``t1ops.guards.fds.ray_runtime_env``): Ray then starts every worker through its
``setup_worker.py``. The two alternate; the ratio is printed per round and overall.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import psutil

CHILD = """
import os, sys, ray
from t1ops.campaign import launch
from t1ops.config import CampaignConfig
own = sys.argv[1] == "own"
cfg = CampaignConfig.model_validate({"run": {"num_cpus": 2}})
if own:
    launch._init_ray(cfg)
else:  # as _init_ray starts a cluster it did not start, on a local one
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, **launch._cluster_kwargs(own=False))

@ray.remote(num_cpus=0)
class Probe:
    def env(self):
        import resource
        return os.environ.get("OMP_NUM_THREADS"), resource.getrlimit(resource.RLIMIT_NOFILE)[0]

actors = [Probe.remote() for _ in range(int(sys.argv[2]))]
print(ray.get([a.env.remote() for a in actors])[0])
ray.shutdown()
"""


def tree_cpu_s(args: list[str]) -> tuple[float, str]:
    """CPU seconds of ``args`` and every process it starts, and its stdout."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    root, seen = psutil.Process(proc.pid), {}
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in procs:
            try:
                t = p.cpu_times()
                seen[(p.pid, p.create_time())] = t.user + t.system
            except psutil.Error:
                continue
        time.sleep(0.05)
    out = proc.stdout.read()
    return sum(seen.values()), out.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actors", type=int, default=6, help="actors per start (a 1-rank campaign has about 5)")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    ratios = []
    for r in range(args.rounds):
        own, seen_own = tree_cpu_s([sys.executable, "-c", CHILD, "own", str(args.actors)])
        env, seen_env = tree_cpu_s([sys.executable, "-c", CHILD, "runtime_env", str(args.actors)])
        ratios.append(env / own)
        print(f"round {r + 1}: own cluster, no runtime_env {own:.1f} CPU-s (worker sees {seen_own}); "
              f"runtime_env {env:.1f} CPU-s (worker sees {seen_env}); ratio {env / own:.2f}; "
              f"{(env - own) / args.actors:.2f} CPU-s per actor", flush=True)
    print(f"runtime_env / own cluster: median ratio {statistics.median(ratios):.2f} over {args.rounds} round(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
