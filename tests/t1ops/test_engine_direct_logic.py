"""DirectEngines' choices without processes: engine affinity of a trajectory, aborts vs barriers."""
from __future__ import annotations

import pytest

from rl.engines import protocol as P
from t1ops.config import EngineConfig
from t1ops.errors import EngineError
from t1ops.engines.direct import DirectEngines


class FakeClient:
    """Answers at once; each scripted answer is (finish type, version, side effect or None)."""

    def __init__(self, url: str, log: list, view: dict) -> None:
        self.url, self.log, self.answers, self.view = url, log, [], view

    def generate(self, request):
        self.log.append((self.url, request.rid))
        kind, version, effect = self.answers.pop(0) if self.answers else ("stop", self.view["version"], None)
        if effect:
            effect()
        return P.GenerateResponse(output_ids=(1,), finish_reason=P.FinishReason(type=kind), weight_version=version,
                                  prompt_tokens=3, completion_tokens=1)


def req(rid: str) -> P.GenerateRequest:
    return P.GenerateRequest(input_ids=(5, 6, 7), sampling_params=P.SamplingParams(max_new_tokens=1), rid=rid)


def test_turns_stay_on_their_engine_and_aborts_follow_the_barrier_count():
    log, reports = [], []
    view = {"version": "v0", "num_syncs": 0, "gate_open": True,
            "engines": [(0, "http://e0", "dead"), (1, "http://e1", "live")]}
    clients = {u: FakeClient(u, log, view) for u in ("http://e0", "http://e1")}
    direct = DirectEngines(lambda: dict(view), lambda *a, **k: reports.append(a), EngineConfig(max_resubmits=1),
                           refresh_s=0.05, make_client=lambda url: clients[url])
    try:
        direct.generate(req("x-t0"))                          # only engine 1 is live
        view["engines"] = [(0, "http://e0", "live"), (1, "http://e1", "live")]
        direct.refresh()
        direct.generate(req("y-t0"))                          # least loaded, listed first: engine 0
        direct.generate(req("x-t1"))                          # x's K/V prefix is on engine 1
        assert log == [("http://e1", "x-t0"), ("http://e0", "y-t0"), ("http://e1", "x-t1")]

        clients["http://e0"].answers = [("abort", "v0", None)]
        with pytest.raises(EngineError, match="outside a weight sync"):  # no barrier explains it
            direct.generate(req("y-t1"))

        def barrier():
            view.update(num_syncs=1, version="v1")
        clients["http://e0"].answers = [("abort", "v0", barrier), ("stop", "v1", None)]
        assert direct.generate(req("y-t2")).weight_version == "v1"  # the barrier's abort: resubmitted

        clients["http://e0"].answers = [("stop", "rogue", None)]
        assert direct.generate(req("y-t3")).weight_version == "v1"  # rogue engine reported, request moved
        assert reports and reports[-1][0] == 0 and "missed a weight sync" in reports[-1][2]
    finally:
        direct.close()


def test_a_resubmit_waits_for_the_pools_verdict_rather_than_reusing_the_engine_that_failed():
    """The seeded schedule's lost step: the pool killed engine 1 (the only live one) and the worker's
    view, up to ``refresh_s`` old, still showed it live, so the loop spent every resubmit on it in
    milliseconds and the trial failed while the pool was starting replacements."""
    import threading

    import httpx

    log, reports = [], []
    view = {"version": "v0", "num_syncs": 0, "gate_open": True,
            "engines": [(0, "http://e0", "dead"), (1, "http://e1", "live")]}

    class Killed(FakeClient):
        def generate(self, request):
            self.log.append((self.url, request.rid))
            raise httpx.ConnectError("[Errno 111] Connection refused")

    def judge(index, url, reason, **kw):  # the pool: the process exited, so the slot is dead now
        reports.append((index, url))
        view["engines"] = [(0, "http://e0", "dead"), (1, "http://e1", "dead")]
        # the pinger finds none left and recreates: the replacement is admitted a little later
        def replacement_live():
            view.update(engines=[(0, "http://e0b", "live"), (1, "http://e1", "dead")])
            direct.refresh()  # as the background refresher would: wakes the waiting request
        threading.Timer(0.3, replacement_live).start()

    clients = {"http://e1": Killed("http://e1", log, view), "http://e0b": FakeClient("http://e0b", log, view)}
    direct = DirectEngines(lambda: dict(view), judge, EngineConfig(max_resubmits=3, generate_timeout_s=30),
                           refresh_s=60.0, make_client=lambda url: clients[url])  # only the test refreshes
    try:
        assert direct.generate(req("x-t0")).weight_version == "v0"
        assert log == [("http://e1", "x-t0"), ("http://e0b", "x-t0")] and reports == [(1, "http://e1")]
    finally:
        direct.close()
