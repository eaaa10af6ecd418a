"""EngineClient against an httpx MockTransport that records every call."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from rl.engines import protocol as P
from rl.engines import protocol_control as PC
from rl.engines.client import EngineClient
from rl.errors import EngineError, MissingRoutingError, ParseError

L, K = 2, 2


class FakeServer:
    """Answers like SGLang; ``overrides[path]`` replaces a response."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict | None]] = []
        self.overrides: dict[str, httpx.Response] = {}
        self.version = "0"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        self.calls.append((request.method, path, body))
        if path in self.overrides:
            return self.overrides[path]
        if path == P.GENERATE:
            req = P.GenerateRequest.from_json(body)
            out = (7, 8, 9)
            rows = req.num_routing_rows(len(out))
            resp = P.GenerateResponse(
                output_ids=out, finish_reason=P.FinishReason("length", length=3), weight_version=self.version,
                prompt_tokens=len(req.input_ids), completion_tokens=len(out), rid=req.rid,
                output_token_logprobs=(-1.0, -2.0, -0.5) if req.return_logprob else None,
                routed_experts_RLK=np.ones((rows, L, K), np.int32) if req.return_routed_experts else None)
            return httpx.Response(200, json=resp.to_json())
        if path == P.UPDATE_WEIGHTS_FROM_DISK:
            upd = PC.UpdateWeightsFromDiskRequest.from_json(body)
            self.version = upd.weight_version
            return httpx.Response(200, json=PC.UpdateWeightsFromDiskResponse(True, "ok").to_json())
        if path == P.MODEL_INFO:
            return httpx.Response(200, json=PC.ModelInfo(self.version, "m").to_json())
        if path == P.UPDATE_WEIGHT_VERSION:
            self.version = PC.UpdateWeightVersionRequest.from_json(body).new_version
            return httpx.Response(200, json={"success": True, "message": "ok", "new_version": self.version})
        if path in (P.PAUSE_GENERATION, P.CONTINUE_GENERATION):
            return httpx.Response(200, json={"message": "ok", "status": "ok"})
        return httpx.Response(200)


@pytest.fixture
def server_client():
    server = FakeServer()
    http = httpx.Client(transport=httpx.MockTransport(server))
    return server, EngineClient("http://engine:30000/", http, num_moe_layers=L, topk=K, num_experts=8)


def _req(routing=True):
    return P.GenerateRequest(input_ids=(1, 2, 3, 4), sampling_params=P.SamplingParams(max_new_tokens=3),
                             return_logprob=True, return_routed_experts=routing, rid="a")


def test_generate_decodes_logprobs_routing_and_version(server_client):
    server, client = server_client
    out = client.generate(_req())
    assert out.output_ids == (7, 8, 9) and out.output_token_logprobs == (-1.0, -2.0, -0.5)
    assert out.routed_experts_RLK.shape == (4 + 3 - 1, L, K)
    assert out.weight_version == "0"
    method, path, body = server.calls[-1]
    assert (method, path) == ("POST", "/generate") and body["return_routed_experts"] is True


def test_missing_routing_is_a_hard_error(server_client):
    server, client = server_client
    good = client.http.request("POST", "http://engine:30000/generate", json=_req().to_json()).json()
    del good["meta_info"]["routed_experts"]
    server.overrides[P.GENERATE] = httpx.Response(200, json=good)
    with pytest.raises(MissingRoutingError):
        client.generate(_req())


def test_control_calls_hit_sglang_endpoints(server_client):
    server, client = server_client
    client.pause_generation()
    client.continue_generation()
    client.abort_request(abort_all=True)
    assert client.flush_cache() and client.health() and client.health_generate()
    client.update_weights_from_disk("/ckpt/3", "3")
    assert client.weight_version() == "3"
    client.update_weight_version("3b")
    assert client.weight_version() == "3b"
    assert [(m, p) for m, p, _ in server.calls] == [
        ("POST", "/pause_generation"), ("POST", "/continue_generation"), ("POST", "/abort_request"),
        ("POST", "/flush_cache"), ("GET", "/health"), ("GET", "/health_generate"),
        ("POST", "/update_weights_from_disk"), ("GET", "/model_info"), ("POST", "/update_weight_version"),
        ("GET", "/model_info")]
    assert server.calls[0][2] == {"mode": "abort"}
    assert server.calls[2][2] == {"rid": "", "abort_all": True}
    assert server.calls[6][2]["model_path"] == "/ckpt/3"


def test_bad_status_and_bodies_raise_named_errors(server_client):
    server, client = server_client
    server.overrides[P.HEALTH_GENERATE] = httpx.Response(503)
    assert client.health_generate() is False
    server.overrides[P.PAUSE_GENERATION] = httpx.Response(500, text="boom")
    with pytest.raises(EngineError, match="pause_generation: HTTP 500: boom"):
        client.pause_generation()
    server.overrides[P.MODEL_INFO] = httpx.Response(200, text="not json")
    with pytest.raises(ParseError, match="not JSON"):
        client.weight_version()
    server.overrides[P.UPDATE_WEIGHTS_FROM_DISK] = httpx.Response(
        400, json={"success": False, "message": "no such checkpoint", "num_paused_requests": 0})
    with pytest.raises(EngineError, match="refused: no such checkpoint"):
        client.update_weights_from_disk("/nope", "4")
    server.overrides[P.ABORT_REQUEST] = httpx.Response(400, text="bad rid")
    with pytest.raises(EngineError, match="HTTP 400"):
        client.abort_request("x")


def test_transport_errors_propagate_from_the_injected_client():
    def refuse(request):
        raise httpx.ConnectError("refused", request=request)
    client = EngineClient("http://engine:1", httpx.Client(transport=httpx.MockTransport(refuse)))
    with pytest.raises(httpx.ConnectError):
        client.health_generate()
