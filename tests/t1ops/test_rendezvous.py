"""The bounded rendezvous (t1ops.guards.rendezvous): fresh port after a taken one, missing ranks named."""
from __future__ import annotations

import multiprocessing
import socket

import pytest
import torch.distributed  # noqa: F401  (once, before the ranks fork)

from t1ops.config import GuardsConfig
from t1ops.errors import GroupInitError, InputError
from t1ops.guards.rendezvous import parse, plan_rendezvous, rendezvous


def _field(window_s: float, attempts: int):
    f = GuardsConfig().field
    f.group_init_timeout_s, f.group_init_attempts = window_s, attempts
    return f


def test_plan_and_parse():
    url = plan_rendezvous("127.0.0.1", _field(1.0, 3))
    host, ports = parse(url)
    assert host == "127.0.0.1" and len(set(ports)) == 3
    assert parse("tcp://10.0.0.1:2345") == ("10.0.0.1", [2345])
    with pytest.raises(InputError, match="expected tcp://host:port"):
        parse("env://")


def _rank(url: str, r: int, field, q) -> None:
    try:
        store = rendezvous(url, r, 2, field)
        store.set(f"seen/{r}", "1")
        store.wait([f"seen/{1 - r}"])   # one store: what one rank writes, the other reads
        # rank 0's process serves the store: it exits only after rank 1's last request (a server that
        # leaves first fails rank 1's wait with "Failed to recv": a race of this test, seen once in CI)
        if r == 1:
            store.set("done/1", "1")
        else:
            store.wait(["done/1"])
        q.put((r, "met"))
    except Exception as err:
        q.put((r, f"{type(err).__name__}: {err}"))


def test_a_taken_port_costs_one_window_then_the_ranks_meet_on_the_next():
    field = _field(2.0, 2)
    url = plan_rendezvous("127.0.0.1", field)
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", parse(url)[1][0]))
    squatter.listen(4)   # accepts, never answers: torch's client would wait past its timeout
    ctx = multiprocessing.get_context("fork")   # ranks are processes (a TCPStore client holds the GIL)
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(url, r, field, q)) for r in (0, 1)]
    try:
        for p in procs:
            p.start()
        got = dict(q.get(timeout=30) for _ in procs)
    finally:
        squatter.close()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    assert got == {0: "met", 1: "met"}


def test_a_rank_that_never_arrives_is_named_after_attempts_x_window():
    field = _field(0.3, 2)
    with pytest.raises(GroupInitError, match=r"ranks \[1, 2\] never arrived after 2 attempt") as err:
        rendezvous(plan_rendezvous("127.0.0.1", field), 0, 3, field)
    assert err.value.context["missing_ranks"] == [1, 2]
