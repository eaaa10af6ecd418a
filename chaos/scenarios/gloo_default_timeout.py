"""gloo-default-timeout: a slow rank at the weight-update barrier outlives Gloo's default.

Fault (real): two gloo ranks (``torch.distributed``, TCP on 127.0.0.1) in two
processes; rank 1 stalls before the weight-update collective for 45 "minutes",
rank 0 waits in it. Time is scaled 2 s : 30 min, so torch's built-in Gloo
default of 30 min is 2 s, the report's 60 min control-group timeout is 4 s, and
the stall is 3 s.

Unguarded: the group carries the built-in default; rank 0's all-reduce raises
"Timed out waiting ... for recv" and the job dies with a traceback that reads
like a crash. Guarded (``t1ops.guards.dist``): the group is created through
``dist.init_process_group`` with ``timeout_for("gloo", guards)`` (refusing to
create one without a timeout), the collective completes, and
``watch_collective`` reports it as slow (event ``dist.collective_slow``), not dead.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from chaos.harness import Guarded, Outcome, register
from rl.engines.ports import free_port

SCALE_S_PER_MIN = 2.0 / 30.0   # 30 min -> 2 s
BUILTIN_DEFAULT_MIN = 30.0     # torch.distributed.constants.default_pg_timeout for Gloo
STALL_MIN = 45.0               # longer than the default, shorter than the report's 60 min
REPO = Path(__file__).resolve().parents[2]


def _rank_main(cfg: dict) -> dict:
    """One rank: join the group, (rank 1) stall, then the weight-update all-reduce."""
    import torch
    import torch.distributed as tdist

    from t1ops.config import GuardsConfig
    from t1ops.guards import dist

    init = f"tcp://127.0.0.1:{cfg['port']}"
    guards = GuardsConfig()
    if cfg["guarded"]:
        timeout_s = dist.timeout_for("gloo", guards).total_seconds() / 60 * SCALE_S_PER_MIN
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s), init_method=init,
                                rank=cfg["rank"], world_size=2)
    else:  # the code as it was: no timeout of its own, so Gloo's built-in default applies (scaled)
        timeout_s = BUILTIN_DEFAULT_MIN * SCALE_S_PER_MIN
        tdist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s), init_method=init,
                                 rank=cfg["rank"], world_size=2)
    if cfg["rank"] == 1:
        time.sleep(STALL_MIN * SCALE_S_PER_MIN)  # the slow actor rank
    out = {"rank": cfg["rank"], "timeout_s": timeout_s, "error": None, "slow_at_s": None, "elapsed_s": None}
    watch = dist.watch_collective("weight-update barrier", timedelta(seconds=timeout_s),
                                  slow_fraction=guards.collective_slow_fraction) if cfg["guarded"] else None
    t0 = time.monotonic()
    try:
        if watch is not None:
            with watch:
                tdist.all_reduce(torch.ones(4))
            out["slow_at_s"] = watch.slow_at_s
        else:
            tdist.all_reduce(torch.ones(4))
    except Exception as err:  # what the user would see in the job log
        out["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    out["elapsed_s"] = time.monotonic() - t0
    Path(cfg["out"]).write_text(json.dumps(out))
    if out["error"] is None:
        tdist.destroy_process_group()
    return out


def _job(tmp: Path, guarded: bool) -> list[dict]:
    """Launch both ranks as real processes; return each rank's report (with its exit code)."""
    port, tag = free_port(), "guarded" if guarded else "unguarded"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs, outs = [], []
    for rank in range(2):
        out = tmp / f"{tag}-rank{rank}.json"
        cfg = {"rank": rank, "port": port, "guarded": guarded, "out": str(out)}
        procs.append(subprocess.Popen([sys.executable, "-m", "chaos.scenarios.gloo_default_timeout",
                                       json.dumps(cfg)], cwd=REPO, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        outs.append(out)
    reports = []
    for p, out in zip(procs, outs):
        _, err = p.communicate(timeout=180)
        rep = json.loads(out.read_text()) if out.exists() else {"error": err[-300:]}
        reports.append({**rep, "returncode": p.returncode})
    return reports


@register("gloo-default-timeout", "Gloo's built-in 30 min timeout kills a slow weight-update barrier")
def run(tmp: Path) -> Outcome:
    unguarded = _job(tmp, guarded=False)
    guarded = _job(tmp, guarded=True)
    stall_s = STALL_MIN * SCALE_S_PER_MIN
    r0 = unguarded[0]
    fault_fired = (r0["returncode"] != 0 and r0["error"] is not None and "Timed out" in r0["error"]
                   and r0["elapsed_s"] < stall_s)
    g0 = guarded[0]
    caught = all(r["error"] is None for r in guarded) and g0["slow_at_s"] is not None
    return Outcome(
        fault_fired=fault_fired,
        unguarded=(f"job died at the weight-update barrier after {r0.get('elapsed_s') or 0:.1f} s "
                   f"(rank 0 exit {r0['returncode']}): {r0['error']}"),
        guarded=Guarded(caught=caught, detection_s=g0["slow_at_s"],
                        error=(f"weight-update barrier has waited {g0['slow_at_s'] or 0:.1f} s of its "
                               f"{g0.get('timeout_s', 0):g} s timeout (= guards.gloo_timeout_min 60 min, scaled): "
                               "a peer rank is slow, not dead")),
        invariants={
            "configured timeout held: both ranks finished": all(r["error"] is None for r in guarded),
            "collective outlived the built-in default": (g0["elapsed_s"] or 0) > BUILTIN_DEFAULT_MIN * SCALE_S_PER_MIN,
            "reported slow before the configured timeout": g0["slow_at_s"] is not None
            and g0["slow_at_s"] < g0["timeout_s"],
        },
        details={"unguarded": unguarded, "guarded": guarded, "stall_s": stall_s,
                 "scale": "2 s per 30 min: built-in default 30 min -> 2 s, configured 60 min -> 4 s, stall 45 min -> 3 s"},
    )


if __name__ == "__main__":
    sys.exit(1 if _rank_main(json.loads(sys.argv[1]))["error"] else 0)  # a failed rank kills the job
