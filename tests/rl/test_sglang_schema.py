"""The client's request payloads against SGLang's own request classes (io_struct.py of the wheel).

Needs the ``sglang`` wheel of :data:`rl.engines.protocol.SGLANG_SCHEMA_VERSION`, downloaded (not
installed): .ci/run does ``pip download sglang==0.5.23 --no-deps -d .venv/sglang-wheel``
(``<venv>/sglang-wheel``, ``/tmp/sglang-wheel`` or ``T1OPS_SGLANG_WHEEL_DIR`` are searched).
Skipped with that reason when absent, which fails CI (tests/conftest.py). ``tests/rl/sglang_schema.py``
says why the classes are read from source instead of imported.
"""
from __future__ import annotations

import pytest

from rl.engines import protocol as P
from rl.engines import protocol_control as PC
from rl.engines import protocol_weights as PW
from tests.rl.sglang_schema import check_payload, find_wheel, read_classes

WHEEL = find_wheel(P.SGLANG_SCHEMA_VERSION)
pytestmark = pytest.mark.skipif(WHEEL is None, reason=f"no sglang-{P.SGLANG_SCHEMA_VERSION} wheel: run `.venv/bin/pip "
                                f"download sglang=={P.SGLANG_SCHEMA_VERSION} --no-deps -d .venv/sglang-wheel`")


@pytest.fixture(scope="module")
def io_struct():
    return read_classes(WHEEL, "sglang/srt/managers/io_struct.py")


@pytest.fixture(scope="module")
def sampling():
    return read_classes(WHEEL, "sglang/srt/sampling/sampling_params.py")


SAMPLING = P.SamplingParams(max_new_tokens=8, temperature=0.7, top_p=0.9, top_k=20, stop_token_ids=(248046,),
                            sampling_seed=3)
PAYLOADS = {
    "GenerateReqInput": P.GenerateRequest(input_ids=(1, 2, 3), sampling_params=SAMPLING, return_routed_experts=True,
                                          routed_experts_start_len=1, rid="r1").to_json(),
    "PauseGenerationReqInput": PC.PauseGenerationRequest("abort").to_json(),
    "ContinueGenerationReqInput": PC.ContinueGenerationRequest().to_json(),
    "AbortReq": PC.AbortRequest(rid="r1").to_json(),
    "UpdateWeightFromDiskReqInput": PC.UpdateWeightsFromDiskRequest(model_path="/x", weight_version="3",
                                                                   load_format="auto").to_json(),
    "UpdateWeightVersionReqInput": PC.UpdateWeightVersionRequest("3").to_json(),
    "InitWeightsUpdateGroupReqInput": PW.InitWeightsUpdateGroupRequest(
        master_address="10.0.0.1", master_port=29600, rank_offset=1, world_size=3, group_name="g",
        backend="nccl").to_json(),
    "UpdateWeightsFromDistributedReqInput": PW.UpdateWeightsFromDistributedRequest(
        names=("model.norm.weight",), dtypes=("bfloat16",), shapes=((64,),), group_name="g",
        weight_version="3").to_json(),
    "DestroyWeightsUpdateGroupReqInput": PW.DestroyWeightsUpdateGroupRequest("g").to_json(),
}


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_payload_fits_sglang_request_class(io_struct, name):
    assert check_payload(io_struct, name, PAYLOADS[name]) == []


def test_sampling_params_fit_sglang_sampling_params(sampling):
    assert check_payload(sampling, "SamplingParams", SAMPLING.to_json()) == []


def test_the_checker_rejects_what_sglang_would(io_struct):
    bad = {**PAYLOADS["UpdateWeightsFromDistributedReqInput"], "tensors": []}
    del bad["names"]
    problems = check_payload(io_struct, "UpdateWeightsFromDistributedReqInput", {**bad, "flush_cache": "yes"})
    assert any("unknown field 'tensors'" in p for p in problems)
    assert any("required field 'names'" in p for p in problems)
    assert any("flush_cache" in p for p in problems)
    assert check_payload(io_struct, "InitWeightsUpdateGroupReqInput", {"master_address": "a", "master_port": "1",
                                                                        "rank_offset": 1, "world_size": 2})
