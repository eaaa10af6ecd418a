"""Bounded control plane: real silent sockets, refused ports, and the per-endpoint policy."""
from __future__ import annotations

import socket

import httpx
import pytest

from rl.engines import protocol as P
from rl.engines.client import EngineClient
from t1ops import telemetry
from t1ops.config import EngineConfig
from t1ops.errors import ControlPlaneTimeout, EngineError, InputError
from t1ops.guards.http import BoundedHttp, policy_for


@pytest.fixture
def silent_url():
    """A real listening socket that completes the TCP handshake and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def refused_url():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def _bounded(**kw) -> BoundedHttp:
    args = dict(timeout_s=0.2, attempts=3, generate_timeout_s=0.3, backoff_s=0.01)
    args.update(kw)
    return BoundedHttp(**args)


def test_policy_table():
    assert policy_for(P.GENERATE) == "generate"
    assert policy_for(P.UPDATE_WEIGHTS_FROM_DISK) == "bulk"
    for path in (P.HEALTH, P.HEALTH_GENERATE, P.PAUSE_GENERATION, P.CONTINUE_GENERATION, P.ABORT_REQUEST,
                 P.FLUSH_CACHE, P.MODEL_INFO, P.UPDATE_WEIGHT_VERSION, "/anything_new"):
        assert policy_for(path) == "control"


@pytest.mark.parametrize("call", ["health_generate", "pause_generation", "continue_generation",
                                  "weight_version", "flush_cache"])
def test_silent_engine_control_call_raises_with_attempts_and_deadline(silent_url, call):
    client = EngineClient(silent_url, _bounded())
    with pytest.raises(ControlPlaneTimeout) as ei:
        getattr(client, call)()
    err = ei.value
    assert err.context["attempts"] == 3 and err.context["max_attempts"] == 3
    assert err.context["deadline_s"] == pytest.approx(3 * (0.2 + 0.08))
    assert "3/3 attempts" in str(err) and "deadline" in str(err) and "ReadTimeout" in str(err)
    assert isinstance(err, TimeoutError)
    assert telemetry.recent_events("http.control_timeout")[-1]["attempts"] == 3


def test_abort_request_is_bounded_too(silent_url):
    with pytest.raises(ControlPlaneTimeout, match="abort_request"):
        EngineClient(silent_url, _bounded(attempts=1)).abort_request("rid-1")


def test_refused_port_exhausts_attempts(refused_url):
    with pytest.raises(ControlPlaneTimeout, match="ConnectError") as ei:
        EngineClient(refused_url, _bounded()).health()
    assert ei.value.context["attempts"] == 3


def test_generate_is_bounded_single_attempt(silent_url):
    client = EngineClient(silent_url, _bounded())
    req = P.GenerateRequest(input_ids=(1,), sampling_params=P.SamplingParams(max_new_tokens=1))
    with pytest.raises(EngineError, match="ReadTimeout.*one attempt"):
        client.generate(req)


def _recording_client(fail_first: int = 0):
    seen: list[httpx.Request] = []

    def handler(request):
        seen.append(request)
        if len(seen) <= fail_first:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == P.UPDATE_WEIGHTS_FROM_DISK:
            return httpx.Response(200, json={"success": True, "message": "ok", "num_paused_requests": 0})
        return httpx.Response(503 if request.url.path == P.HEALTH_GENERATE else 200, json={})
    return seen, httpx.Client(transport=httpx.MockTransport(handler))


def test_retry_then_success_and_no_retry_on_an_answer():
    seen, inner = _recording_client(fail_first=2)
    http = _bounded(client=inner)
    client = EngineClient("http://e:1", http)
    client.continue_generation()
    assert len(seen) == 3
    assert client.health_generate() is False  # 503 is an answer: unhealthy, not retried
    assert len(seen) == 4


def test_control_calls_carry_the_timeout_and_bulk_carries_none():
    seen, inner = _recording_client()
    client = EngineClient("http://e:1", _bounded(client=inner))
    client.pause_generation()
    client.update_weights_from_disk("/ckpt/1", "1")
    control, bulk = seen
    assert control.extensions["timeout"] == {"connect": 0.2, "read": 0.2, "write": 0.2, "pool": 0.2}
    assert bulk.extensions["timeout"] == {"connect": None, "read": None, "write": None, "pool": None}
    assert telemetry.recent_events("http.unbounded_bulk_call")[-1]["endpoint"] == P.UPDATE_WEIGHTS_FROM_DISK


def test_from_config_and_bad_arguments():
    http = BoundedHttp.from_config(EngineConfig(request_timeout_s=1.5, request_attempts=4))
    assert (http.timeout_s, http.attempts) == (1.5, 4)
    with pytest.raises(InputError, match="attempts"):
        BoundedHttp(timeout_s=1, attempts=0, generate_timeout_s=1)
