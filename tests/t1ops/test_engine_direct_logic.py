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
