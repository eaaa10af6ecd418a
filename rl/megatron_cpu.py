"""Run megatron-core's GPTModel (MoE) on a CPU-only host.

megatron-core 0.16.1 builds, runs forward and backward on CPU with the local
layer spec and the ``allgather`` token dispatcher once four CUDA assumptions
are bypassed (docs/architecture.md, "Embedded defaults"). ``apply_cpu_shims()`` patches
them at runtime, only when ``torch.cuda.is_available()`` is False; upstream
files are never edited (docs/style.md 9). Each shim says why it exists, and
``tests/rl/test_megatron_cpu.py`` fails if an upgrade makes one unnecessary
or insufficient.

Two more CUDA paths are avoided by the callers instead of patched:
``rl.model`` passes its own causal attention mask (megatron's default one is
built with ``device="cuda"``) and builds without linear biases.

``init_single_process()`` makes the gloo world of 1 that megatron's
parallel_state needs, with tensor/pipeline parallel size 1 and the
model-parallel RNG seeded. Both functions are idempotent.
``init_model_parallel()`` is the multi-rank twin: the caller has created the
default process group (t1ops does it through ``t1ops.guards.dist`` with an
explicit timeout); it sets up megatron's TP/EP/DP groups with that timeout.
``teardown()`` undoes either, so one process can build the layout-independent
initial weights in a world of 1 and then join its real world.

``SequenceParallelNorm`` replaces the local spec's torch LayerNorm: megatron
refuses torch norms under sequence parallelism because their gradients are
partial per tensor-parallel rank; this norm marks its parameters
``sequence_parallel`` so the trainer all-reduces them over the TP group
(``rl.trainer.grads``), as megatron's own fused norms are marked.
"""
from __future__ import annotations

import contextlib
from datetime import timedelta

import torch

from rl.errors import InputError

_APPLIED = False
_CPU_DEVICE = "cpu"


def _cpu_current_device() -> str:
    return _CPU_DEVICE


def _cpu_get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
    """CPU twin of ``GlobalMemoryBuffer.get_tensor`` (same caching contract)."""
    required_len = 1
    for dim in tensor_shape:
        required_len *= int(dim)
    cached = self.buffer.get((name, dtype))
    if cached is None or cached.numel() < required_len:
        self.buffer[(name, dtype)] = torch.empty(required_len, dtype=dtype, device="cpu")
    return self.buffer[(name, dtype)][0:required_len].view(*tensor_shape)


def _cpu_tracker_add(self, name, seed):
    """CPU twin of ``CudaRNGStatesTracker.add``: a named CPU generator state."""
    self._is_initialized = True
    if seed in self.seeds_:
        raise InputError(f"rng seed {seed} already registered", seed=seed)
    if name in self.states_:
        raise InputError(f"rng state {name!r} already registered", name=name)
    self.seeds_.add(seed)
    self.states_[name] = torch.Generator().manual_seed(seed).get_state()


@contextlib.contextmanager
def _cpu_tracker_fork(self, name="model-parallel-rng"):
    """CPU twin of ``CudaRNGStatesTracker.fork``: swap the CPU RNG state in and out."""
    if name not in self.states_:
        raise InputError(f"rng state {name!r} was never added; call init_single_process()", name=name)
    outer_state = torch.get_rng_state()
    torch.set_rng_state(self.states_[name])
    try:
        yield
    finally:
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(outer_state)


def _apply_no_te_shim() -> None:
    """moe_utils binds ``te_general_gemm`` only when Transformer Engine imports; without TE (CPU,
    or a GPU host without it) the router's gating linear hits a NameError. None selects its
    torch.mm fallback."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def apply_cpu_shims() -> bool:
    """Patch megatron-core's four CUDA assumptions when CUDA is absent.

    Returns True when shims are (now or already) in place, False when CUDA is
    available and nothing was patched. Safe to call any number of times.
    """
    global _APPLIED
    _apply_no_te_shim()
    if torch.cuda.is_available():
        return False
    if _APPLIED:
        return True
    from megatron.core import utils as mcore_utils
    from megatron.core.tensor_parallel import random as mcore_random

    # 1. Router.gating moves a CPU weight to torch.cuda.current_device(), and the
    #    rotary embedding and the GPT model place buffers there. Without CUDA that
    #    call asserts; "cpu" is the only device such a host has.
    torch.cuda.current_device = _cpu_current_device
    # 2. GlobalMemoryBuffer.get_tensor (used by the allgather dispatcher's
    #    gather) hard-codes device=torch.cuda.current_device(); allocate on CPU
    #    explicitly so this does not depend on shim 1.
    mcore_utils.GlobalMemoryBuffer.get_tensor = _cpu_get_tensor
    # 3. The RNG tracker's add()/fork() save and restore CUDA generator states
    #    (embedding dropout, expert init); keep the same named-state contract on
    #    the CPU generator instead.
    mcore_random.CudaRNGStatesTracker.add = _cpu_tracker_add
    mcore_random.CudaRNGStatesTracker.fork = _cpu_tracker_fork
    # 4. (Transformer Engine absent, CUDA or not) is _apply_no_te_shim().
    _APPLIED = True
    return True


class SequenceParallelNorm:
    """megatron's ``WrappedTorchNorm`` (torch LayerNorm / RMSNorm, same parameters and numerics)
    usable under sequence parallelism: the parameters are marked ``sequence_parallel``."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_unused) -> torch.nn.Module:
        norms = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}
        if config.normalization not in norms:
            raise InputError(f"SequenceParallelNorm implements {sorted(norms)}, config asks {config.normalization!r}")
        norm = norms[config.normalization](normalized_shape=hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = bool(config.sequence_parallel)
        return norm


def init_model_parallel(*, tp: int = 1, pp: int = 1, ep: int = 1, cp: int = 1, seed: int = 1234,
                        timeout_s: float) -> None:
    """megatron parallel state over an existing default process group of ``dp * tp * pp * cp`` ranks.

    ``cp`` > 1 makes megatron's context-parallel groups, which ``rl.model.context_parallel`` reads
    (the model's own config keeps ``context_parallel_size`` 1: megatron's GatedDeltaNet refuses CP).

    Every group megatron creates gets ``timeout_s`` (its own default is 30 min).
    Expert tensor parallelism is 1 (the report's layout); ``ep`` must divide
    ``world / pp``. Raises InputError when no process group exists yet or a
    different layout is already initialised.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    apply_cpu_shims()
    if not torch.distributed.is_initialized():
        raise InputError("init_model_parallel needs the default process group first "
                         "(t1ops.guards.dist.init_process_group creates it with an explicit timeout)")
    if parallel_state.model_parallel_is_initialized():
        have = (parallel_state.get_tensor_model_parallel_world_size(),
                parallel_state.get_pipeline_model_parallel_world_size(),
                parallel_state.get_expert_model_parallel_world_size(),
                parallel_state.get_context_parallel_world_size())
        if have != (tp, pp, ep, cp):
            raise InputError(f"megatron parallel state already holds tp/pp/ep/cp = {have}, asked {(tp, pp, ep, cp)}; "
                             "call teardown() first", have=have)
        return
    parallel_state.initialize_model_parallel(
        tp, pp, context_parallel_size=cp, expert_model_parallel_size=ep, expert_tensor_parallel_size=1,
        distributed_timeout_minutes=timeout_s / 60.0, create_gloo_process_groups=False)
    model_parallel_cuda_manual_seed(seed)


def teardown() -> None:
    """Destroy megatron's parallel state and the default process group (either may be absent)."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def init_single_process(backend: str = "gloo", seed: int = 1234, timeout_s: float = 60.0) -> None:
    """Make a world of 1 for megatron-core: process group, parallel state, RNG.

    Applies the CPU shims first when CUDA is absent. Idempotent: a second
    call (any arguments) leaves the existing world in place. Raises
    InputError when a larger world already exists in this process.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    apply_cpu_shims()
    if not torch.distributed.is_initialized():
        # An in-process HashStore: no TCP port to collide with (a parent's
        # MASTER_PORT leaks into child processes) and no environment edits.
        torch.distributed.init_process_group(
            backend=backend, store=torch.distributed.HashStore(), rank=0, world_size=1,
            timeout=timedelta(seconds=timeout_s),
        )
    world_size = torch.distributed.get_world_size()
    if world_size != 1:
        raise InputError(
            f"init_single_process needs a world of 1, found {world_size}; "
            "call it in a process that has no other process group",
            world_size=world_size,
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(seed)
