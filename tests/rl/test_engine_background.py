"""A background loop nobody awaits reports its death (rl.engines.background; swallowed-engine-death).

In process, no server: the supervisor hands a loop's exception to its owner; the embedded
engine whose batch scheduler raises fails its in-flight and later requests with
EngineFailedError (HTTP 503 on the wire) and its health checks, instead of leaving them waiting.
The same fault with the supervisor off leaves a request waiting (the failure the guard removes).
"""
from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest
import torch

from rl.engines import protocol as P
from rl.engines.background import EngineFailedError, report_errors, supervised_thread
from rl.engines.embedded_engine import EmbeddedEngine
from rl.model import ModelSpec
from rl.vocab import CompactVocab

SPEC = ModelSpec(num_layers=1, hidden_size=32, num_attention_heads=2, num_query_groups=2, ffn_hidden_size=32,
                 num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=64, vocab_size=64)


def _request() -> P.GenerateRequest:
    return P.GenerateRequest(input_ids=(1, 2, 3), sampling_params=P.SamplingParams(max_new_tokens=8))


def test_supervised_thread_reports_the_exception_that_ended_it():
    died = []
    done = threading.Event()

    def loop():
        raise ValueError("boom")

    supervised_thread(loop, name="t", on_death=lambda why: (died.append(why), done.set())).join(5)
    assert done.is_set() and died == ["background loop 't' died: ValueError: boom"]


def test_report_errors_calls_back_with_a_futures_exception_only():
    seen = []
    with cf.ThreadPoolExecutor(1) as ex:
        report_errors(ex.submit(lambda: 1), seen.append, "ok").result()
        fut = report_errors(ex.submit(lambda: 1 / 0), seen.append, "ping")
        cf.wait([fut])
    assert seen == ["ping raised ZeroDivisionError: division by zero"]


def _engine(**kw) -> EmbeddedEngine:
    return EmbeddedEngine(SPEC, CompactVocab.identity(SPEC.vocab_size), torch.float32, 0, chaos_fail_after=2, **kw)


def test_a_dead_scheduler_fails_every_request_and_the_health_check():
    engine = _engine()
    with pytest.raises(EngineFailedError, match="RuntimeError: chaos: batch scheduler raised"):
        engine.generate(_request())  # in flight when the loop died
    assert engine.failed and "engine-batcher" in engine.failed
    with pytest.raises(EngineFailedError):
        engine.generate(_request())  # refused at once afterwards
    with pytest.raises(EngineFailedError):
        engine.health_generate()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the bare loop dies
def test_without_the_supervisor_the_request_waits_forever():
    engine = _engine(supervised=False)
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(engine.generate, _request())
        done, _ = cf.wait([fut], timeout=3.0)
        assert not done and engine.failed is None  # hung, and nothing says why
        engine.abort("", abort_all=True)  # the aborted request is never finished by a dead loop either
        assert not cf.wait([fut], timeout=0.5)[0]
        engine.scheduler._died("test cleanup")  # release the waiter so the executor can exit
        with pytest.raises(EngineFailedError):
            fut.result(timeout=5)
