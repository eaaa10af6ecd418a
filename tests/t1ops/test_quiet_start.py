"""A healthy `t1ops run` starts quietly and on its own Ray cluster (docs/campaign.md, "Ray's lifetime")."""
from __future__ import annotations

import logging
import os

import pytest

from t1ops.campaign import launch
from t1ops.config import CampaignConfig


def test_only_rays_token_auth_notice_is_dropped(caplog) -> None:
    launch._quiet_auth_notice()
    launch._quiet_auth_notice()  # idempotent: one filter
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    assert sum(isinstance(f, launch._DropAuthNotice) for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.")
        logger.warning("Token authentication is disabled for this Ray cluster. Anyone with network access ...")
    assert [r.getMessage()[:40] for r in caplog.records] == ["Token authentication is disabled for thi"]


@pytest.mark.parametrize("address, env, expected", [
    (None, None, "local"),                       # never a cluster another process left behind
    (None, "10.0.0.1:6379", None),               # RAY_ADDRESS chosen by the user: Ray reads it
    ("10.0.0.2:6379", None, "10.0.0.2:6379"),
])
def test_a_campaign_starts_its_own_cluster_unless_told_otherwise(monkeypatch, address, env, expected) -> None:
    import ray

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    cfg = CampaignConfig.model_validate({"run": {"ray_address": address}})
    launch._init_ray(cfg)
    assert seen["address"] == expected


_PROBE = """
import os, resource, ray
from t1ops.campaign import launch
from t1ops.config import CampaignConfig
from t1ops.guards.fds import raise_nofile_limit
raise_nofile_limit()                      # what run_campaign does before Ray starts
launch._init_ray(CampaignConfig.model_validate({"run": {"num_cpus": 2}}))

@ray.remote(num_cpus=2)  # Ray would give it OMP_NUM_THREADS=2 by its own default
class Probe:
    def seen(self):
        return os.environ.get("OMP_NUM_THREADS"), resource.getrlimit(resource.RLIMIT_NOFILE)[0]

print(ray.get(Probe.remote().seen.remote()), os.environ.get("OMP_NUM_THREADS"))
ray.shutdown()
"""


def test_workers_of_its_own_cluster_inherit_one_omp_thread_and_the_raised_nofile_limit() -> None:
    """No job-level runtime_env on a cluster of our own (launch._cluster_kwargs): a worker still runs
    one OpenMP thread and has the raised soft nofile limit, and the driver's own environment is as it was."""
    import ast
    import os
    import resource
    import subprocess
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, 256)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

    env = {**os.environ, "OMP_NUM_THREADS": "3"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, preexec_fn=lower, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    worker, driver_omp = line.rsplit(" ", 1)
    assert ast.literal_eval(worker) == ("1", hard)
    assert driver_omp == "3"


def test_a_cluster_it_did_not_start_gets_the_settings_through_the_runtime_env() -> None:
    assert "runtime_env" not in launch._cluster_kwargs(own=True)
    env = launch._cluster_kwargs(own=False)["runtime_env"]
    assert env["env_vars"] == launch.WORKER_ENV
    assert env["worker_process_setup_hook"] == "t1ops.guards.fds.worker_setup_hook"


_NEXT_CLUSTER = """
import ray
from ray.cluster_utils import Cluster
from t1ops.campaign import launch
from t1ops.config import CampaignConfig
launch._init_ray(CampaignConfig.model_validate({"run": {"num_cpus": 1}}))  # a campaign's own cluster
ray.shutdown()
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)

@ray.remote(num_cpus=0)
class Role:
    def ping(self):
        return "pong"

try:
    print(ray.get(Role.remote().ping.remote(), timeout=120))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


def test_a_later_cluster_in_the_same_process_still_starts_actors() -> None:
    """Ray's own environment survives a campaign's start (launch.worker_env_while_ray_starts): with the
    whole environment restored, the next cluster this process started ran without token authentication
    while the process kept it on, and Ray destroyed each new actor before it ran ("all references to
    the actor were removed ... never ran"), the shared two-node campaign's trainer in CI."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # a fresh process's Ray settings
    out = subprocess.run([sys.executable, "-c", _NEXT_CLUSTER], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "pong", out.stderr[-2000:]


def test_worker_env_sets_only_its_keys_and_keeps_what_the_block_added(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("T1OPS_TEST_ADDED", raising=False)
    with launch.worker_env_while_ray_starts({"OMP_NUM_THREADS": "1"}):
        assert os.environ["OMP_NUM_THREADS"] == "1"
        os.environ["T1OPS_TEST_ADDED"] = "kept"  # as ray.init sets RAY_AUTH_MODE
    assert os.environ["OMP_NUM_THREADS"] == "3" and os.environ.pop("T1OPS_TEST_ADDED") == "kept"
