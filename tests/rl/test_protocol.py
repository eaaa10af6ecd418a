"""SGLang wire schema: round trips and strict rejection of malformed payloads.

The schema was checked field by field against SGLang 0.5.23
(``sglang/srt/managers/io_struct.py``: GenerateReqInput, PauseGenerationReqInput,
ContinueGenerationReqInput, UpdateWeightFromDiskReqInput/Output, AbortReq;
``sglang/srt/entrypoints/http_server.py`` for the endpoint paths and
``/model_info``'s ``weight_version``; ``state_capturer/routed_experts.py`` for
the base64 int32 routing codec).
"""
from __future__ import annotations

import base64

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.engines import protocol as P
from rl.engines import protocol_control as PC
from rl.errors import MissingRoutingError, ParseError, RoutingError

L, K = 2, 2  # moe layers, topk


def test_schema_version_is_the_checked_release():
    assert P.SGLANG_SCHEMA_VERSION == "0.5.23"


def _request(n_prompt=3, routing=True, start=0) -> P.GenerateRequest:
    return P.GenerateRequest(input_ids=tuple(range(10, 10 + n_prompt)),
                             sampling_params=P.SamplingParams(max_new_tokens=4, temperature=1.0),
                             return_logprob=True, return_routed_experts=routing,
                             routed_experts_start_len=start, rid="r1")


def _response(req: P.GenerateRequest, out=(5, 6), version="3") -> dict:
    rows = req.num_routing_rows(len(out))
    routing = np.arange(rows * L * K, dtype=np.int32).reshape(rows, L, K) % 8
    return P.GenerateResponse(output_ids=tuple(out), finish_reason=P.FinishReason("length", length=2),
                              weight_version=version, prompt_tokens=len(req.input_ids),
                              completion_tokens=len(out), rid=req.rid,
                              output_token_logprobs=tuple(-0.5 for _ in out),
                              routed_experts_RLK=routing).to_json()


def test_generate_request_uses_sglang_field_names():
    body = _request().to_json()
    assert set(body) == {"input_ids", "sampling_params", "return_logprob", "return_routed_experts",
                         "routed_experts_start_len", "rid", "stream"}
    assert body["sampling_params"]["max_new_tokens"] == 4
    assert P.GenerateRequest.from_json(body) == _request()


def test_generate_request_rejects_unknown_and_streaming():
    body = _request().to_json()
    with pytest.raises(ParseError, match="unsupported field"):
        P.GenerateRequest.from_json({**body, "text": "hi"})
    with pytest.raises(ParseError, match="streaming"):
        P.GenerateRequest.from_json({**body, "stream": True})
    with pytest.raises(ParseError, match="routed_experts_start_len"):
        P.GenerateRequest.from_json({**body, "routed_experts_start_len": 4})
    with pytest.raises(ParseError, match="max_new_tokens"):
        P.GenerateRequest.from_json({**body, "sampling_params": {}})
    with pytest.raises(ParseError, match="JSON object"):
        P.GenerateRequest.from_json([1, 2])


def test_routing_rows_cover_prompt_plus_output_minus_one():
    req = _request(n_prompt=3)
    parsed = P.parse_generate_response(_response(req), req, num_moe_layers=L, topk=K)
    assert parsed.routed_experts_RLK.shape == (3 + 2 - 1, L, K)
    assert parsed.routed_experts_RLK.dtype == np.int32
    assert parsed.output_token_logprobs == (-0.5, -0.5)
    assert parsed.weight_version == "3" and parsed.finish_reason.type == "length"
    req2 = _request(n_prompt=3, start=2)
    parsed2 = P.parse_generate_response(_response(req2), req2, num_moe_layers=L, topk=K)
    assert parsed2.routed_experts_RLK.shape == (3 + 2 - 1 - 2, L, K)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 255), min_size=L * K, max_size=40 * L * K).map(
    lambda xs: xs[: len(xs) - len(xs) % (L * K)]))
def test_routing_codec_round_trips(values):
    arr = np.asarray(values, dtype=np.int32).reshape(-1, L, K)
    back = P.decode_routed_experts(P.encode_routed_experts(arr), L, K, arr.shape[0])
    np.testing.assert_array_equal(back, arr)


def test_routing_errors_name_field_and_counts():
    req = _request()
    body = _response(req)
    bad = dict(body, meta_info=dict(body["meta_info"], routed_experts="!!notbase64!!"))
    with pytest.raises(RoutingError, match="sample r1 .*not valid base64"):
        P.parse_generate_response(bad, req, num_moe_layers=L, topk=K)
    short = dict(body, meta_info=dict(body["meta_info"], routed_experts=base64.b64encode(b"\0" * 16 * 3).decode()))
    with pytest.raises(RoutingError, match=r"3 rows but 4 were expected") as ei:
        P.parse_generate_response(short, req, num_moe_layers=L, topk=K)
    assert ei.value.context["num_rows"] == 3 and ei.value.context["expected_rows"] == 4
    odd = dict(body, meta_info=dict(body["meta_info"], routed_experts=base64.b64encode(b"\0" * 5).decode()))
    with pytest.raises(RoutingError, match="5 bytes"):
        P.parse_generate_response(odd, req, num_moe_layers=L, topk=K)
    missing = dict(body, meta_info={k: v for k, v in body["meta_info"].items() if k != "routed_experts"})
    with pytest.raises(MissingRoutingError, match="rollout must abort"):
        P.parse_generate_response(missing, req, num_moe_layers=L, topk=K)
    with pytest.raises(RoutingError, match=r"out of range \[0, 4\)"):
        P.parse_generate_response(body, req, num_moe_layers=L, topk=K, num_experts=4)
    with pytest.raises(ParseError, match="num_moe_layers"):
        P.parse_generate_response(body, req)


def test_missing_and_inconsistent_fields_are_parse_errors():
    req = _request(routing=False)
    body = _response(req)
    for key in ("weight_version", "finish_reason", "completion_tokens"):
        meta = {k: v for k, v in body["meta_info"].items() if k != key}
        with pytest.raises(ParseError, match=f"missing field '{key}'"):
            P.parse_generate_response(dict(body, meta_info=meta), req)
    with pytest.raises(ParseError, match="missing field 'output_ids'"):
        P.parse_generate_response({"meta_info": body["meta_info"]}, req)
    lp = dict(body["meta_info"], output_token_logprobs=[[-0.1, 5, None]])
    with pytest.raises(ParseError, match="1 entries for 2 output ids"):
        P.parse_generate_response(dict(body, meta_info=lp), req)
    swapped = dict(body["meta_info"], output_token_logprobs=[[-0.1, 6, None], [-0.1, 5, None]])
    with pytest.raises(ParseError, match=r"token id 6 differs from output_ids\[0\] = 5"):
        P.parse_generate_response(dict(body, meta_info=swapped), req)
    positive = dict(body["meta_info"], output_token_logprobs=[[0.5, 5, None], [-0.1, 6, None]])
    with pytest.raises(ParseError, match="> 0"):
        P.parse_generate_response(dict(body, meta_info=positive), req)
    with pytest.raises(ParseError, match="completion_tokens = 2 but output_ids has 1"):
        P.parse_generate_response(dict(body, output_ids=[5]), req)
    unfinished = dict(body["meta_info"], finish_reason=None)
    with pytest.raises(ParseError, match="unfinished"):
        P.parse_generate_response(dict(body, meta_info=unfinished), req)


def test_abort_response_is_returned_unvalidated_for_resubmission():
    req = _request()
    body = {"text": "", "output_ids": [5], "meta_info": {
        "id": "r1", "finish_reason": {"type": "abort", "message": "paused", "status_code": None},
        "prompt_tokens": 3, "completion_tokens": 1, "weight_version": "3"}}
    parsed = P.parse_generate_response(body, req, num_moe_layers=L, topk=K)
    assert parsed.finish_reason.is_abort and parsed.routed_experts_RLK is None


def test_weight_version_spans_flag_a_request_across_two_versions():
    req = _request(routing=False)
    body = _response(req)
    body["meta_info"]["weight_versions"] = [{"version": "3", "start": 0, "end": 1},
                                            {"version": "4", "start": 1, "end": 2}]
    assert P.parse_generate_response(body, req).spans_versions
    body["meta_info"]["weight_versions"] = [{"version": "3", "start": 0, "end": 2}]
    assert not P.parse_generate_response(body, req).spans_versions


def test_control_payloads_match_sglang():
    assert PC.PauseGenerationRequest().to_json() == {"mode": "abort"}
    assert PC.PauseGenerationRequest.from_json({"mode": "in_place"}).mode == "in_place"
    with pytest.raises(ParseError, match="mode"):
        PC.PauseGenerationRequest.from_json({"mode": "sleep"})
    assert PC.ContinueGenerationRequest.from_json({}) == PC.ContinueGenerationRequest()
    upd = PC.UpdateWeightsFromDiskRequest(model_path="/ckpt/step3", weight_version="3")
    assert PC.UpdateWeightsFromDiskRequest.from_json(upd.to_json()) == upd
    with pytest.raises(ParseError, match="model_path"):
        PC.UpdateWeightsFromDiskRequest.from_json({"weight_version": "3"})
    out = PC.UpdateWeightsFromDiskResponse.from_json({"success": False, "message": "no such dir",
                                                      "num_paused_requests": 0})
    assert not out.success and out.message == "no such dir"
    ver = PC.UpdateWeightVersionRequest("7")
    assert ver.to_json() == {"new_version": "7", "abort_all_requests": True}
    assert PC.UpdateWeightVersionRequest.from_json(ver.to_json()) == ver
    with pytest.raises(ParseError, match="new_version"):
        PC.UpdateWeightVersionRequest.from_json({"abort_all_requests": False})
    assert PC.AbortRequest(abort_all=True).to_json() == {"rid": "", "abort_all": True}
    with pytest.raises(ParseError, match="rid or abort_all"):
        PC.AbortRequest.from_json({})
    assert PC.ModelInfo.from_json({"weight_version": "default", "model_path": "m"}).weight_version == "default"
    with pytest.raises(ParseError, match="weight_version"):
        PC.ModelInfo.from_json({"model_path": "m"})
    assert PC.ok_status(200) and not PC.ok_status(503)
