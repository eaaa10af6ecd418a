"""group-init-race: a process-group init hangs on a timing race instead of timing out.

verl issue #6967 (github.com/verl-project/verl/issues/6967): the first process-group init of a
run hung forever on a rendezvous race, no traceback, GPUs idle. Fault (real): two gloo ranks
(``torch.distributed``, as ``t1ops.campaign.trainer_rank.join_world`` creates them) meet on a
port the launcher probed free (``free_port``); between that probe and rank 0's bind another
process takes it (a listening socket this scenario opens, that accepts and never answers). A
third job starts only rank 0 of a world of 2: rank 1 never arrives. Time is scaled: the
configured group timeout and the rendezvous window (``guards.field.group_init_timeout_s``) are
2 s; the unguarded ranks are watched by this scenario's own outer bound of 3 x that timeout.

Unguarded: ``torch.distributed.init_process_group("gloo", init_method="tcp://...",
timeout=2 s)``: rank 0 dies with EADDRINUSE and rank 1, connected to the stranger, is still
blocked in TCPStore's handshake at the outer bound (far past its 2 s timeout), named nowhere.
Guarded (``t1ops.guards.dist.init_process_group`` -> ``t1ops.guards.rendezvous``): the attempt
on the taken port fails within its window, both ranks meet on the next fresh port and an
all-reduce over the group works; the job whose rank 1 never started fails within
attempts x window with an error naming rank 1.
"""
from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

from chaos.harness import Guarded, Outcome, Timeline, register

TIMEOUT_S = 2.0           # the configured group timeout, scaled
WINDOW_S = 2.0            # guards.field.group_init_timeout_s, scaled
OUTER_BOUND_S = 3 * TIMEOUT_S


def rank_main(cfg: dict) -> dict:
    """One rank: line up with the started peers, init the group, all-reduce a 1, report."""
    import torch
    import torch.distributed as dist

    from t1ops.config import GuardsConfig
    from t1ops.guards import dist as dist_guard

    out, rank = Path(cfg["out"]), cfg["rank"]
    (out / f"ready{rank}").touch()
    while not all((out / f"ready{r}").exists() for r in cfg["started"]):
        time.sleep(0.01)
    rep: dict = {"rank": rank, "pid": os.getpid(), "error": None}
    t0, wall0 = time.monotonic(), time.time()
    try:
        if cfg["guarded"]:
            guards = GuardsConfig()
            guards.field.group_init_timeout_s, guards.field.group_init_attempts = WINDOW_S, cfg["attempts"]
            dist_guard.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S), guards=guards,
                                          init_method=cfg["init_method"], rank=rank, world_size=cfg["world"])
        else:  # what code without the guard does: torch's own rendezvous, with the configured timeout
            dist.init_process_group("gloo", init_method=cfg["init_method"], rank=rank, world_size=cfg["world"],
                                    timeout=timedelta(seconds=TIMEOUT_S))
        rep["init_s"] = round(time.monotonic() - t0, 3)
        from t1ops import telemetry  # the guard's first failed attempt: its detection of the taken port
        retries = telemetry.recent_events("dist.rendezvous_retry", since=wall0)
        rep["retry_s"] = round(retries[0]["time"] - wall0, 3) if retries else None
        x = torch.ones(1)
        dist.all_reduce(x)
        rep["sum"] = x.item()
        dist.destroy_process_group()
    except Exception as err:
        rep.update(init_s=round(time.monotonic() - t0, 3), error=f"{type(err).__name__}: {str(err)[:900]}")
    (out / f"rank{rank}.json").write_text(json.dumps(rep))
    return rep


def _rank_process(cfg: dict) -> None:
    import torch

    log = os.open(Path(cfg["out"]) / f"rank{cfg['rank']}.log", os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 2)   # torch's C++ store errors go to the rank's log, not the report's terminal
    torch.set_num_threads(1)
    rank_main(cfg)


def _spawn(out: Path, cfg: dict, ranks: list[int]):
    """The rank processes of one job, forked from a fork server (torch is imported once, there)."""
    import multiprocessing

    out.mkdir(parents=True)
    # forked from a fresh fork server that imported torch once (each rank starts in milliseconds), not
    # from this process: a test or scenario run earlier in it may hold a default process group, and a
    # forked rank would inherit it ("trying to initialize the default process group twice")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed", "chaos.scenarios.group_init_race"])
    procs = [ctx.Process(target=_rank_process, args=({**cfg, "rank": r, "started": ranks, "out": str(out)},),
                         daemon=True) for r in ranks]
    for p in procs:
        p.start()
    return procs


def _collect(out: Path, procs, bound_s: float) -> list[dict]:
    """Each rank's report, or ``blocked`` when it was still inside the init at ``bound_s``."""
    reps = []
    deadline = time.monotonic() + bound_s
    for r, p in enumerate(procs):
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
        path = out / f"rank{r}.json"
        reps.append({**(json.loads(path.read_text()) if path.exists() else {"rank": r, "blocked": True}),
                     "returncode": p.exitcode})
    return reps


def _squat(port: int) -> socket.socket:
    """Another process's listener on the probed port: accepts connections, never answers."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(16)
    return s


@register("group-init-race", "a process-group init hangs on a port race instead of timing out")
def run(tmp: Path) -> Outcome:
    from rl.engines.ports import free_port
    from t1ops.config import GuardsConfig
    from t1ops.guards.rendezvous import parse, plan_rendezvous

    field = GuardsConfig().field
    field.group_init_attempts = 3
    raced = free_port()                       # the launcher's probe ...
    plan = plan_rendezvous("127.0.0.1", field)
    squatters = [_squat(raced), _squat(parse(plan)[1][0])]   # ... and the port taken before rank 0 binds
    field.group_init_attempts = 2
    lonely = plan_rendezvous("127.0.0.1", field)
    base = {"world": 2, "attempts": 3}
    t0 = time.monotonic()
    try:  # the three jobs at once: one wait
        jobs = {"unguarded": _spawn(tmp / "unguarded", {**base, "guarded": False,
                                                         "init_method": f"tcp://127.0.0.1:{raced}"}, [0, 1]),
                "guarded": _spawn(tmp / "guarded", {**base, "guarded": True, "init_method": plan}, [0, 1]),
                "missing": _spawn(tmp / "missing", {**base, "guarded": True, "attempts": 2,
                                                    "init_method": lonely}, [0])}
        # the outer bound counts from the rendezvous, not from interpreter start-up
        while not all((tmp / name / "ready0").exists() for name in jobs) and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        reps = {name: _collect(tmp / name, procs, OUTER_BOUND_S if name == "unguarded" else 60)
                for name, procs in jobs.items()}
    finally:
        for s in squatters:
            s.close()
    u, g, m = reps["unguarded"], reps["guarded"], reps["missing"]
    eaddr = "EADDRINUSE" in (u[0].get("error") or "") or "address already in use" in (u[0].get("error") or "")
    blocked = bool(u[1].get("blocked"))
    met = all(r.get("error") is None and r.get("sum") == 2.0 for r in g)
    named = "ranks [1] never arrived" in (m[0].get("error") or "")
    bound_g = 3 * WINDOW_S + 2.0      # attempts x window, and slack for a loaded host
    detection = max((r.get("init_s") or 0.0) for r in g) if met else None
    tl = Timeline()  # the guarded ranks' clocks, from the init on the raced port plan
    tl.fault(at=0.0)
    retries = [r["retry_s"] for r in g if r.get("retry_s") is not None]
    tl.after_fault(detected=min(retries) if retries else None, healthy=detection)
    return Outcome(
        fault_fired=eaddr and blocked,
        unguarded=(f"rank 0 died: {(u[0].get('error') or '')[:160]}; rank 1 still blocked in torch's rendezvous "
                   f"at the outer bound of {OUTER_BOUND_S:g} s (its timeout: {TIMEOUT_S:g} s), named nowhere"),
        guarded=Guarded(caught=met and named, detection_s=detection,
                        error=(m[0].get("error") or "")[:600]),
        invariants={
            "unguarded: rank 1 blocked in init past 3 x its timeout": blocked,
            "unguarded: rank 0 died on the taken port": eaddr,
            "guarded ranks met on a fresh port within attempts x window": met and (detection or 99) < bound_g,
            "the group works: all-reduce sums both ranks": met,
            "never-arrived rank named within attempts x window": named and (m[0].get("init_s") or 99) < 2 * WINDOW_S + 2.0,
        },
        details={"unguarded": u, "guarded": g, "missing": m, "raced_port": raced, "plan": plan,
                 "scale": f"group timeout and rendezvous window {TIMEOUT_S:g} s; outer bound {OUTER_BOUND_S:g} s"},
        recovery=tl.recovery(how="in place: the attempt on the taken port failed at its window; the next fresh "
                                 "port met"),
    )
