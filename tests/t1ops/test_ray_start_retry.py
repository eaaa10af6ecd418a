"""A campaign's own Ray cluster starts even when Ray's start-up times out under load
(t1ops/campaign/ray_start.py; ray-project/ray#65983; docs/testing.md, "Flakes").

The fault is real: the first dashboard agent of the node is SIGSTOPped as it starts, as a loaded
2-core host stalled it, so the raylet times out waiting for the agent's port file and ``ray.init``
raises Ray's own "timed out during startup". Unguarded (one attempt) the start fails; guarded, the
start is tried again and an actor runs on the new node."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from t1ops.campaign.ray_start import is_startup_timeout, start_with_retry

_PROBE = """
import json, os, signal, threading, time
import psutil, ray
from t1ops import telemetry
from t1ops.campaign import launch, ray_start
from t1ops.config import CampaignConfig

ray_start.ATTEMPTS = int(os.environ["ATTEMPTS"])
stalled = []

def stall_first_agent():                      # the fault: the node's first dashboard agent stalls
    while True:
        for p in psutil.Process().children(recursive=True):
            try:
                argv = p.cmdline()             # the agent itself, not the raylet (its argv names the agent)
                if argv and ("python" in os.path.basename(argv[0]) and any(a.endswith("dashboard/agent.py") for a in argv[:3])
                             or argv[0].startswith("ray::DashboardAgent")):
                    p.send_signal(signal.SIGSTOP)
                    stalled.append(p.pid)
                    return
            except psutil.Error:
                pass
        time.sleep(0.002)

threading.Thread(target=stall_first_agent, daemon=True).start()
out = {"stalled": stalled}
try:
    launch._init_ray(CampaignConfig.model_validate({"run": {"num_cpus": 1}}))
    out["pong"] = ray.get(ray.remote(lambda: "pong").remote(), timeout=60)
except Exception as err:
    out["error"] = str(err).splitlines()[0]
finally:
    for pid in stalled:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    out["retries"] = [e["attempt"] for e in telemetry.recent_events("ray.start_retry")]
    ray.shutdown()
print("RESULT " + json.dumps(out))
"""


def _probe(attempts: int, log) -> dict:
    env = {**os.environ, "ATTEMPTS": str(attempts)}
    env.pop("RAY_ADDRESS", None)
    # output to a file, not a pipe: the failed node's agents outlive the probe a while, holding its stdout
    with open(log, "w") as out:
        subprocess.run([sys.executable, "-c", _PROBE], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    line = next((l for l in text.splitlines() if l.startswith("RESULT ")), None)
    assert line, text[-3000:]
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow
def test_a_stalled_agent_fails_one_start_and_the_retry_starts_the_node(tmp_path) -> None:
    unguarded = _probe(1, tmp_path / "unguarded.log")
    assert unguarded["stalled"], unguarded                                  # the fault fired
    assert "timed out during startup" in unguarded.get("error", ""), unguarded   # and one start fails
    guarded = _probe(3, tmp_path / "guarded.log")
    assert guarded["stalled"] and guarded.get("pong") == "pong", guarded    # the retry's node runs an actor
    assert guarded["retries"] == [1], guarded


def test_only_rays_startup_timeout_is_tried_again() -> None:
    calls = []

    def start():
        calls.append(1)
        raise RuntimeError("Ray has not been started yet: bad num_cpus")

    with pytest.raises(RuntimeError, match="bad num_cpus"):
        start_with_retry(start)
    assert len(calls) == 1
    assert is_startup_timeout(Exception("The current node timed out during startup. This could happen ..."))


def test_a_start_that_times_out_every_time_fails_t1ops_run_with_one_line(tmp_path, monkeypatch, capsys) -> None:
    """`t1ops run` whose every Ray start times out: one line naming the problem and the fix (the
    project's rule), not Ray's traceback; the run is marked crashed with it."""
    import ray

    from t1ops import cli, telemetry
    from t1ops.campaign import ray_start

    calls = []

    def timed_out(*args, **kwargs):   # Ray's own error, as ray/_private/node.py raises it
        calls.append(1)
        raise Exception("The current node timed out during startup. This could happen because some of "
                        "the Ray processes failed to startup.")

    monkeypatch.setattr(ray, "init", timed_out)
    monkeypatch.setattr(ray_start, "ATTEMPTS", 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        rc = cli.main(["run", "examples/tiny/campaign.toml", "--out", str(tmp_path), "--no-progress"])
    finally:
        telemetry.shutdown()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(calls) == 2
    assert "Traceback" not in "\n".join(err) and len(err) == 1, err
    assert err[0].startswith("t1ops run: ControlPlaneTimeout: Ray's local node timed out during startup 2 time(s)"), err
    assert "run.ray_address" in err[0] and "ray start --head" in err[0]
    status = json.loads(next(tmp_path.glob("*/status.json")).read_text())
    assert status["state"] == "crashed" and status["error"].startswith("ControlPlaneTimeout: Ray's local node"), status
