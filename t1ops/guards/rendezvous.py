"""A bounded process-group rendezvous, retried on fresh ports (catalogue id group-init-race).

verl issue #6967: the first process-group init of a run hung on a timing race instead of
timing out. torch shows the same shape: a TCPStore client whose rendezvous port was taken by
another process between the launcher's probe and rank 0's bind (``free_port`` then ``bind``)
connects to that process and waits in its handshake past the ``timeout`` it was given
(reproduced by ``t1ops chaos run group-init-race``); rank 0 dies with EADDRINUSE, and a rank
that never starts leaves its peers waiting the whole group timeout with no name on it.

:func:`rendezvous` bounds it. An init method ``tcp://host:port`` or
``t1ops-rdzv://host?ports=p1,p2,p3`` (:func:`plan_rendezvous`) gives one port per attempt.
Attempt ``k`` runs on every rank from ``start + k x window`` to ``start + (k+1) x window`` (its
own start: ranks that start within one window of each other meet): rank 0 serves a TCPStore on
port ``k``, the others connect (on a thread, so a port held by a stranger costs the window, not
forever), every rank writes ``arrived/<rank>``, and rank 0 says ``go`` once all have. An
attempt that fails moves to the next port; the last failure is :class:`GroupInitError` naming
the ranks that never arrived and what each attempt saw.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

from t1ops import telemetry
from t1ops.errors import GroupInitError, InputError
from t1ops.guards.field_config import FieldGuardsConfig

SCHEME = "t1ops-rdzv"
RUNBOOK = "runbooks/group-init-race.md"
POLL_S = 0.05


def plan_rendezvous(host: str, field: FieldGuardsConfig | None = None) -> str:
    """The init method of a new group: ``field.group_init_attempts`` distinct free ports on ``host``."""
    from rl.engines.ports import free_port

    n = (field or FieldGuardsConfig()).group_init_attempts
    ports: list[int] = []
    while len(ports) < n:
        p = free_port(host)
        if p not in ports:
            ports.append(p)
    return f"{SCHEME}://{host}?ports={','.join(map(str, ports))}"


def parse(init_method: str) -> tuple[str, list[int]]:
    """(host, ports) of a ``tcp://host:port`` or ``t1ops-rdzv://host?ports=...`` init method."""
    u = urlsplit(init_method)
    if u.scheme == "tcp" and u.hostname and u.port:
        return u.hostname, [u.port]
    if u.scheme == SCHEME and u.hostname:
        ports = [int(p) for p in parse_qs(u.query).get("ports", [""])[0].split(",") if p]
        if ports:
            return u.hostname, ports
    raise InputError(f"init method {init_method!r}: expected tcp://host:port or {SCHEME}://host?ports=p1,p2",
                     init_method=init_method)


def _release(port: int) -> None:
    """Shut down this process's sockets to ``port``: a TCPStore client blocked in its handshake with
    a stranger (torch gives no way to interrupt it) returns, instead of holding the process at exit."""
    import psutil

    for c in psutil.Process().net_connections(kind="tcp"):
        if c.raddr and c.raddr.port == port and c.fd >= 0:
            try:
                s = socket.socket(fileno=os.dup(c.fd))
                s.shutdown(socket.SHUT_RDWR)
                s.close()  # the duplicate only; the client's own fd errors out and is closed by it
            except OSError:
                pass


def _connect(host: str, port: int, world_size: int, window_s: float):
    """A client TCPStore, or None when none answered within ``window_s`` (then its socket is shut)."""
    import torch.distributed as dist

    box: dict = {}

    def target() -> None:
        try:
            box["store"] = dist.TCPStore(host, port, world_size, False, timedelta(seconds=max(window_s, 0.1)))
        except Exception as err:  # refused / timed out: the attempt failed, said below
            box["error"] = err

    t = threading.Thread(target=target, name=f"rdzv-connect-{port}", daemon=True)
    t.start()
    t.join(window_s)
    if t.is_alive():
        _release(port)
        t.join(1.0)
    return box.get("store"), box.get("error")


def _attempt(host: str, port: int, rank: int, world_size: int, end: float) -> tuple[object | None, str, list[int]]:
    """One attempt; (store or None, what happened, ranks not arrived)."""
    import torch.distributed as dist

    everyone = list(range(world_size))
    try:
        if rank == 0:
            store = dist.TCPStore(host, port, world_size, True, timedelta(seconds=max(end - time.monotonic(), 0.1)),
                                  wait_for_workers=False)
        else:
            store, err = _connect(host, port, world_size, max(end - time.monotonic(), 0.0))
            if store is None:
                why = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}" if err else "no answer"
                return None, (f"port {port}: rank 0's store did not answer within the window ({why}); the "
                              "port is held by another process or rank 0 never arrived"), [0]
        store.set(f"arrived/{rank}", str(os.getpid()))
        while True:  # at least one look, however late the store came up
            missing = [r for r in everyone if not store.check([f"arrived/{r}"])]
            if not missing and (rank == 0 or store.check(["go"])):
                if rank == 0:
                    store.set("go", "1")
                return store, "ok", []
            if time.monotonic() >= end:
                return None, f"port {port}: ranks {missing} never arrived within the window", missing
            time.sleep(POLL_S)
    except Exception as err:  # bind refused (port taken) or the store went away
        return None, f"port {port}: {type(err).__name__}: {str(err).splitlines()[0][:200]}", []


def rendezvous(init_method: str, rank: int, world_size: int, field: FieldGuardsConfig | None = None,
               clock=time.monotonic):
    """Every rank meets on one port within ``group_init_timeout_s``, trying each port in turn; the
    store they met on. Raises :class:`GroupInitError` naming the ranks that never arrived."""
    import torch.distributed  # noqa: F401  (imported before the clock starts: seconds on a loaded host)

    f = field or FieldGuardsConfig()
    host, ports = parse(init_method)
    window = f.group_init_timeout_s
    start, seen, missing = clock(), [], set()
    for k, port in enumerate(ports):
        begin = start + k * window
        if clock() < begin:  # attempt k starts at the same offset on every rank
            time.sleep(begin - clock())
        store, what, absent = _attempt(host, port, rank, world_size, begin + window)
        if store is not None:
            if k:
                telemetry.event("dist.rendezvous_recovered", "warn", rank=rank, attempt=k, port=port,
                                earlier=" | ".join(seen), runbook=RUNBOOK)
            return store
        seen.append(what)
        missing = set(absent) or missing
        telemetry.event("dist.rendezvous_retry", "warn", rank=rank, attempt=k, port=port, reason=what,
                        runbook=RUNBOOK)
    names = f"ranks {sorted(missing)} never arrived" if missing else "no attempt completed"
    msg = (f"process-group rendezvous of rank {rank} (world {world_size}) failed: {names} after "
           f"{len(ports)} attempt(s) of {window:g} s (guards.field.group_init_timeout_s) on fresh ports: "
           + "; ".join(seen) + f". Check that every rank was started and can reach {host}. See {RUNBOOK}.")
    telemetry.event("dist.rendezvous_failed", "error", rank=rank, missing=sorted(missing), message=msg)
    raise GroupInitError(msg, rank=rank, missing_ranks=sorted(missing), attempts=seen)
