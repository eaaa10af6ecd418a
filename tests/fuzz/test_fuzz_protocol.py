"""Fuzz the SGLang wire parsers (rl/engines/protocol.py, rl/routing.py, rl/engines/client.py).

An engine's answer is outside data: a malformed body (random JSON, one field
of a valid response replaced or removed, bad base64 routing, wrong log-prob
rows, unknown finish reasons) must raise ParseError / RoutingError /
MissingRoutingError naming the field, and a valid response must round-trip.
"""
from __future__ import annotations

import base64
import json

import httpx
import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz_common import FAST, json_values, mutate, mutations, names_one_of, only_t1ops_errors
from rl.engines import protocol as P
from rl.engines import protocol_control as PC
from rl.engines.client import EngineClient
from rl.errors import EngineError, InputError, MissingRoutingError, ParseError, RoutingError
from rl.routing import decode_routed_experts, encode_routed_experts

L, K, E = 2, 2, 8  # moe layers, topk, experts
WIRE_ERRORS = (ParseError, RoutingError, MissingRoutingError)


def _request(n_prompt: int = 3, routing: bool = True, start: int = 0, logprob: bool = True) -> P.GenerateRequest:
    return P.GenerateRequest(input_ids=tuple(range(10, 10 + n_prompt)),
                             sampling_params=P.SamplingParams(max_new_tokens=8),
                             return_logprob=logprob, return_routed_experts=routing,
                             routed_experts_start_len=start, rid="r1")


REQ = _request()


def _valid_body(req: P.GenerateRequest = REQ, out=(5, 6)) -> dict:
    rows = req.num_routing_rows(len(out))
    return P.GenerateResponse(
        output_ids=tuple(out), finish_reason=P.FinishReason("length", length=len(out)),
        weight_version="3", prompt_tokens=len(req.input_ids), completion_tokens=len(out), rid=req.rid,
        output_token_logprobs=tuple(-0.5 for _ in out),
        routed_experts_RLK=np.arange(rows * L * K, dtype=np.int32).reshape(rows, L, K) % E,
        weight_versions=(P.WeightVersionSpan("3", 0, len(out)),)).to_json()


BODY = _valid_body()


def _parse(body, req: P.GenerateRequest = REQ) -> P.GenerateResponse:
    return P.parse_generate_response(body, req, num_moe_layers=L, topk=K, num_experts=E)


def _check_accepted(resp: P.GenerateResponse, req: P.GenerateRequest = REQ) -> None:
    """What an accepted, finished response guarantees to the trainer."""
    assert isinstance(resp.weight_version, str)
    assert all(0 <= s.start <= s.end <= len(resp.output_ids) for s in resp.weight_versions)
    assert resp.rid is None or isinstance(resp.rid, str)
    assert resp.text is None or isinstance(resp.text, str)
    if resp.finish_reason.is_abort:
        return
    assert resp.completion_tokens == len(resp.output_ids)
    assert all(isinstance(t, int) and t >= 0 for t in resp.output_ids)
    assert resp.output_token_logprobs is not None
    assert len(resp.output_token_logprobs) == len(resp.output_ids)
    assert all(np.isfinite(lp) and lp <= 0 for lp in resp.output_token_logprobs)
    assert resp.routed_experts_RLK.shape == (req.num_routing_rows(len(resp.output_ids)), L, K)
    assert ((resp.routed_experts_RLK >= 0) & (resp.routed_experts_RLK < E)).all()


# --- /generate responses --------------------------------------------------------------
@FAST
@given(json_values)
@example({"meta_info": {"finish_reason": {"type": "stop"}, "weight_version": "1", "prompt_tokens": 3,
                        "completion_tokens": 0, "weight_versions": 5}, "output_ids": []})
def test_random_json_is_refused_with_a_wire_error(body):
    with only_t1ops_errors(*WIRE_ERRORS) as caught:
        resp = _parse(body)
    if not caught:
        _check_accepted(resp)


@FAST
@given(mutations(BODY))
@example((("meta_info", "routed_experts"), 7, False))                 # routing not a string
@example((("meta_info", "routed_experts"), "é", False))                # routing not ASCII base64
@example((("meta_info", "weight_versions"), 3, False))                 # spans not a list
@example((("meta_info", "weight_versions", 0), [1], False))           # a span not an object
@example((("meta_info", "weight_versions", 0, "end"), 99, False))     # a span past the output
@example((("meta_info", "id"), {"x": 1}, False))                      # rid not a string
@example((("text",), [1], False))                                      # text not a string
@example((("meta_info", "finish_reason", "matched"), {"x": 1}, False))  # matched not id/string
@example((("meta_info", "finish_reason", "type"), ["stop"], False))    # unhashable finish type
@example((("meta_info", "output_token_logprobs", 0, 0), float("nan"), False))
def test_one_mutated_field_is_refused_or_still_valid(edit):
    path, value, delete = edit
    body = mutate(BODY, path, value, delete)
    with only_t1ops_errors(*WIRE_ERRORS) as caught:
        resp = _parse(body)
    if caught:
        keys = [k for k in path if isinstance(k, str)]
        assert names_one_of(caught[0], *keys, "response", "meta_info", "finish_reason",
                            "weight_versions", "output_ids"), (path, str(caught[0]))
    else:
        _check_accepted(resp)


@FAST
@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6), st.integers(1, 6), st.integers(0, 6),
       st.sampled_from(["stop", "length"]), st.lists(st.floats(-50, 0), min_size=6, max_size=6))
def test_valid_responses_round_trip(out, n_prompt, start, kind, logprobs):
    req = _request(n_prompt=n_prompt, start=min(start, n_prompt))
    rows = req.num_routing_rows(len(out))
    routing = (np.arange(rows * L * K, dtype=np.int32) % E).reshape(rows, L, K)
    finish = P.FinishReason(kind, matched=out[-1]) if kind == "stop" else P.FinishReason(kind, length=len(out))
    sent = P.GenerateResponse(output_ids=tuple(out), finish_reason=finish, weight_version="7",
                              prompt_tokens=n_prompt, completion_tokens=len(out), rid="r1", text="hi",
                              output_token_logprobs=tuple(logprobs[:len(out)]), routed_experts_RLK=routing)
    got = _parse(json.loads(json.dumps(sent.to_json())), req)
    assert got == sent
    assert np.array_equal(got.routed_experts_RLK, routing)


# --- routing base64 ------------------------------------------------------------------
@FAST
@given(json_values | st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode()),
       st.none() | st.integers(0, 4))
@example(12, 1)
@example("aGk=\n", None)
@example("ÿÿÿÿ", 1)
def test_routing_payload_is_decoded_or_refused(b64, num_rows):
    with only_t1ops_errors(RoutingError, MissingRoutingError) as caught:
        rows = decode_routed_experts(b64, L, K, num_rows, num_experts=E, sample="s")
    if caught:
        assert "sample s" in str(caught[0]) or "routed_experts" in str(caught[0])
    else:
        assert rows.dtype == np.int32 and rows.shape[1:] == (L, K)
        assert num_rows is None or rows.shape[0] == num_rows
        assert ((rows >= 0) & (rows < E)).all()


@FAST
@given(st.integers(-2, 3), st.integers(-2, 3))
def test_routing_shape_arguments_are_checked(num_layers, topk):
    with only_t1ops_errors(InputError, RoutingError) as caught:
        decode_routed_experts(encode_routed_experts(np.zeros((2, 2, 2), np.int32)), num_layers, topk)
    if num_layers <= 0 or topk <= 0:
        assert caught and names_one_of(caught[0], "num_layers", "topk")


# --- finish reasons and control payloads ----------------------------------------------
@FAST
@given(json_values)
@example({"type": "stop", "matched": [1]})
@example({"type": {"a": 1}})
def test_finish_reason_is_parsed_or_refused(d):
    with only_t1ops_errors(ParseError) as caught:
        fr = P.FinishReason.from_json(d)
    if caught:
        assert "finish_reason" in str(caught[0])
    else:
        assert fr.type in ("stop", "length", "abort")
        assert fr.matched is None or (isinstance(fr.matched, (int, str)) and not isinstance(fr.matched, bool))
        assert P.FinishReason.from_json(fr.to_json()).type == fr.type


PARSERS = [P.SamplingParams, P.GenerateRequest, PC.PauseGenerationRequest, PC.ContinueGenerationRequest,
           PC.UpdateWeightsFromDiskRequest, PC.UpdateWeightsFromDiskResponse, PC.AbortRequest, PC.ModelInfo]
VALID = [P.SamplingParams(max_new_tokens=4, temperature=0.5, top_k=3, stop_token_ids=(2,), sampling_seed=1),
         REQ, PC.PauseGenerationRequest("retract"), PC.ContinueGenerationRequest(False),
         PC.UpdateWeightsFromDiskRequest("/ckpt", "5", "auto"), PC.UpdateWeightsFromDiskResponse(False, "no", 2),
         PC.AbortRequest(rid="r9"), PC.ModelInfo("5", "/m")]


@FAST
@given(st.sampled_from(PARSERS), json_values)
@example(P.GenerateRequest, {"input_ids": [1], "sampling_params": {"max_new_tokens": 1, "top_p": float("nan")}})
@example(PC.UpdateWeightsFromDiskResponse, {"success": True, "message": "ok", "num_paused_requests": -1})
def test_control_payloads_are_parsed_or_refused(cls, d):
    with only_t1ops_errors(ParseError) as caught:
        obj = cls.from_json(d)
    if not caught:
        assert cls.from_json(json.loads(json.dumps(obj.to_json()))) == obj


@FAST
@given(st.sampled_from(range(len(VALID))).flatmap(
    lambda i: st.tuples(st.just(i), mutations(VALID[i].to_json()))))
def test_control_payloads_with_one_bad_field(case):
    i, (path, value, delete) = case
    cls, body = PARSERS[i], mutate(VALID[i].to_json(), path, value, delete)
    with only_t1ops_errors(ParseError) as caught:
        obj = cls.from_json(body)
    if caught:
        keys = [k for k in path if isinstance(k, str)]
        assert names_one_of(caught[0], *keys, "abort_request", "sampling_params", "generate"), str(caught[0])
    else:
        assert cls.from_json(json.loads(json.dumps(obj.to_json()))) == obj


@FAST
@given(st.sampled_from(VALID))
def test_control_payloads_round_trip(obj):
    assert type(obj).from_json(json.loads(json.dumps(obj.to_json()))) == obj


# --- the client over a hostile HTTP server ---------------------------------------------
_bodies = (json_values.map(lambda v: json.dumps(v).encode())
           | st.binary(max_size=30)
           | st.just(json.dumps(BODY).encode())
           | st.builds(lambda b, n: b[:n], st.just(json.dumps(BODY).encode()), st.integers(0, 200)))


def _client(status: int, content: bytes) -> EngineClient:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=content))
    return EngineClient("http://engine", httpx.Client(transport=transport), num_moe_layers=L, topk=K, num_experts=E)


@FAST
@given(st.sampled_from([200, 200, 200, 400, 404, 500, 503]), _bodies,
       st.sampled_from(["generate", "weight_version", "update_weights_from_disk", "pause_generation",
                        "continue_generation", "abort_request"]))
@example(200, b"\xff\xfe", "generate")
@example(400, json.dumps({"success": True, "message": "ok"}).encode(), "update_weights_from_disk")
def test_client_turns_any_answer_into_a_result_or_an_engine_error(status, content, call):
    client = _client(status, content)
    args = {"generate": (REQ,), "update_weights_from_disk": ("/ckpt", "2"), "abort_request": ("r1",)}
    with only_t1ops_errors(EngineError, *WIRE_ERRORS) as caught:
        out = getattr(client, call)(*args.get(call, ()))
    if caught:
        assert "http://engine" in str(caught[0]) or names_one_of(caught[0], "meta_info", "response",
                                                                  "routed_experts", "model_info", "success",
                                                                  "message", "weight_version")
    elif call == "generate":
        _check_accepted(out)
    elif call == "weight_version":
        assert isinstance(out, str)


@FAST
@given(st.sampled_from([0, "", False, [], 0.0]))
def test_falsy_values_of_the_wrong_type_are_not_read_as_absent(falsy):
    """``x or default`` would turn 0 / "" / false into an empty default: only null means absent."""
    cases = [(P.SamplingParams, {"max_new_tokens": 1, "stop_token_ids": falsy}),
             (PC.PauseGenerationRequest, falsy), (PC.ContinueGenerationRequest, falsy), (PC.AbortRequest, falsy),
             (PC.AbortRequest, {"rid": falsy, "abort_all": True}),
             (PC.UpdateWeightsFromDiskResponse, {"success": True, "message": "", "num_paused_requests": -1})]
    for cls, body in cases:
        if (cls is P.SamplingParams and falsy == []) or (isinstance(body, dict) and body.get("rid") == ""):
            continue  # an empty list is a valid stop_token_ids, an empty string a valid (absent) rid
        with only_t1ops_errors(ParseError) as caught:
            cls.from_json(body)
        assert caught, f"{cls.__name__}.from_json({body!r}) was accepted"
    assert P.SamplingParams.from_json({"max_new_tokens": 1, "stop_token_ids": None}).stop_token_ids == ()
    assert PC.PauseGenerationRequest.from_json(None) == PC.PauseGenerationRequest()
