"""The CPU shims for megatron-core: each must stay necessary and sufficient.

The probe runs in a fresh interpreter (shims are process-global) and reports
JSON; an upgrade that fixes one of the four CUDA assumptions, or adds a fifth,
fails here with a message naming the shim.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import rl.megatron_cpu as megatron_cpu

REPO = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent(
    """
    import json, warnings
    warnings.filterwarnings("ignore")
    import torch
    from megatron.core import parallel_state, utils as mcore_utils
    from megatron.core.tensor_parallel import random as mcore_random
    from megatron.core.transformer.moe import moe_utils
    import rl.megatron_cpu as mc

    def fails(fn):
        try:
            fn()
            return None
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"[:200]

    def fork_default():
        tracker = mcore_random.CudaRNGStatesTracker()
        tracker.states_["model-parallel-rng"] = torch.get_rng_state()
        with tracker.fork():
            pass

    report = {"before": {
        "current_device": fails(torch.cuda.current_device),
        "get_tensor": fails(lambda: mcore_utils.GlobalMemoryBuffer().get_tensor((2,), torch.float32, "x")),
        "tracker_add": fails(lambda: mcore_random.CudaRNGStatesTracker().add("x", 1)),
        "tracker_fork": fails(fork_default),
        "te_general_gemm_defined": hasattr(moe_utils, "te_general_gemm"),
    }}
    originals = {
        "current_device": (torch.cuda, "current_device", torch.cuda.current_device),
        "get_tensor": (mcore_utils.GlobalMemoryBuffer, "get_tensor", mcore_utils.GlobalMemoryBuffer.get_tensor),
        "tracker_add": (mcore_random.CudaRNGStatesTracker, "add", mcore_random.CudaRNGStatesTracker.add),
        "tracker_fork": (mcore_random.CudaRNGStatesTracker, "fork", mcore_random.CudaRNGStatesTracker.fork),
    }
    mc.init_single_process()
    from rl.model import ModelSpec, build_policy, token_logprobs
    spec = ModelSpec(num_layers=1, hidden_size=32, num_attention_heads=2, ffn_hidden_size=32,
                     num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16, max_seq_len=16, vocab_size=50)
    buffer_calls = []
    shimmed_get_tensor = mcore_utils.GlobalMemoryBuffer.get_tensor
    def counting_get_tensor(self, *args, **kwargs):
        buffer_calls.append(args[0])
        return shimmed_get_tensor(self, *args, **kwargs)

    def pipeline():
        parallel_state._GLOBAL_MEMORY_BUFFER = mcore_utils.GlobalMemoryBuffer()
        model = build_policy(spec, 0)
        ids = torch.randint(0, 50, (2, 6))
        token_logprobs(model, ids, ids).sum().backward()

    mcore_utils.GlobalMemoryBuffer.get_tensor = counting_get_tensor
    report["with_all_shims"] = fails(pipeline)
    report["get_tensor_calls"] = len(buffer_calls)
    mcore_utils.GlobalMemoryBuffer.get_tensor = shimmed_get_tensor
    report["without"] = {}
    for name, (owner, attr, original) in originals.items():
        shim = getattr(owner, attr)
        setattr(owner, attr, original)
        report["without"][name] = fails(pipeline)
        setattr(owner, attr, shim)
    del moe_utils.te_general_gemm
    report["without"]["te_general_gemm"] = fails(pipeline)
    moe_utils.te_general_gemm = None
    print("PROBE" + json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def probe() -> dict:
    if torch.cuda.is_available():
        pytest.skip("the shims apply only on hosts without CUDA")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=240
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE")]
    assert proc.returncode == 0 and lines, f"probe crashed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("PROBE"):])


def test_each_original_still_targets_cuda(probe: dict) -> None:
    before = probe["before"]
    for name in ("current_device", "get_tensor", "tracker_add", "tracker_fork"):
        assert before[name] is not None, (
            f"megatron/torch {name} now works without CUDA: the shim for it in rl/megatron_cpu.py "
            "is unnecessary; remove it"
        )
    assert not before["te_general_gemm_defined"], (
        "moe_utils.te_general_gemm is now defined without Transformer Engine; remove shim 4"
    )


def test_shims_are_sufficient_for_forward_and_backward(probe: dict) -> None:
    assert probe["with_all_shims"] is None, f"shims are no longer sufficient: {probe['with_all_shims']}"
    # GlobalMemoryBuffer is really on the path (allgather dispatcher), so shim 2 matters.
    assert probe["get_tensor_calls"] > 0, "GlobalMemoryBuffer.get_tensor is no longer used; drop shim 2"


def test_each_shim_is_needed_on_the_model_path(probe: dict) -> None:
    without = probe["without"]
    print(json.dumps(without, indent=1))
    for name in ("current_device", "tracker_add", "tracker_fork", "te_general_gemm"):
        assert without[name] is not None, f"build+forward+backward works without the {name} shim; drop it"
    # get_tensor's original allocates on torch.cuda.current_device(), which shim 1
    # already redirects; its own necessity is checked in test_each_original_still_targets_cuda.


def test_apply_is_idempotent_and_skipped_with_cuda(monkeypatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a CPU-only host")
    assert megatron_cpu.apply_cpu_shims() is True
    patched = torch.cuda.current_device
    assert megatron_cpu.apply_cpu_shims() is True
    assert torch.cuda.current_device is patched
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert megatron_cpu.apply_cpu_shims() is False


def test_init_single_process_is_idempotent() -> None:
    from megatron.core import parallel_state

    megatron_cpu.init_single_process()
    megatron_cpu.init_single_process()
    assert torch.distributed.get_world_size() == 1
    assert parallel_state.get_tensor_model_parallel_world_size() == 1
    assert parallel_state.get_expert_model_parallel_world_size() == 1
