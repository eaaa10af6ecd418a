"""Cluster plan files: the model shape, the layout and the hardware of a training run.

A plan is TOML typed by the :class:`Plan` sections below and loaded with
``load_toml(path, model=Plan)``; unknown keys and out-of-range values raise
:class:`~t1ops.errors.ConfigError`. Derived quantities (data parallelism,
layers per stage, parameter counts) are computed, never written, so changing
one number (say ``parallelism.cp``) is enough to ask about another layout.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator

from t1ops.config import Section, load_toml
from t1ops.config_errors import FileKind
from t1ops.parallel_layout import layers_split, plan_errors
from t1ops.preflight.calibration import SANDBOX_WORKER_GIB


class ModelShape(Section):
    """Shape of the trained model (defaults: Qwen3.5-122B-A10B, report sections 05 and 08)."""

    name: str = Field("Qwen3.5-122B-A10B", description="Model name, for the report only.")
    num_layers: int = Field(48, ge=1, le=512, description="Decoder layers (report: 48).")
    full_attention_interval: int = Field(4, ge=1, le=512, description="Every Nth layer is full attention, the rest GatedDeltaNet (1: all full attention).")
    hidden_size: int = Field(3072, ge=8, description="Hidden size (report: 3072).")
    num_attention_heads: int = Field(32, ge=1, description="Query heads of the full-attention layers (report: 32).")
    num_kv_groups: int = Field(2, ge=1, description="Key/value groups of the full-attention layers (report: 2).")
    head_dim: int = Field(256, ge=8, description="Head dimension of the full-attention layers.")
    attention_output_gate: bool = Field(True, description="Full attention has a sigmoid output gate (doubles the query projection).")
    gdn_num_key_heads: int = Field(16, ge=1, description="GatedDeltaNet query/key heads.")
    gdn_num_value_heads: int = Field(64, ge=1, description="GatedDeltaNet value heads.")
    gdn_head_dim: int = Field(128, ge=8, description="GatedDeltaNet head dimension (keys and values).")
    gdn_conv_kernel: int = Field(4, ge=1, description="GatedDeltaNet short-convolution width.")
    num_experts: int = Field(256, ge=1, description="Routed experts per MoE layer (report: 256).")
    moe_router_topk: int = Field(8, ge=1, description="Routed experts per token (report: top-8).")
    num_shared_experts: int = Field(1, ge=0, description="Always-on shared experts per layer (report: 1).")
    moe_ffn_hidden_size: int = Field(1024, ge=8, description="FFN size of one routed expert.")
    shared_expert_ffn_hidden_size: int = Field(1024, ge=0, description="Dense FFN size of the shared expert(s).")
    vocab_size: int = Field(248_320, ge=256, description="Vocabulary (report: 248,320).")
    tie_embeddings: bool = Field(False, description="Input embedding and LM head share one matrix.")

    @model_validator(mode="after")
    def _topk_fits(self) -> "ModelShape":
        if self.moe_router_topk > self.num_experts:
            raise ValueError(f"moe_router_topk {self.moe_router_topk} > num_experts {self.num_experts}")
        return self

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers // self.full_attention_interval

    @property
    def num_gdn_layers(self) -> int:
        return self.num_layers - self.num_full_attention_layers


class Parallelism(Section):
    """Training layout. DP is derived: train_gpus / (tp * pp * cp)."""

    train_gpus: int = Field(64, ge=1, le=1_048_576, description="GPUs of the trainer (actor and critic share them).")
    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs per host (host-RAM check is per node).")
    tp: int = Field(2, ge=1, description="Tensor parallelism (report: pinned at 2).")
    pp: int = Field(2, ge=1, description="Pipeline parallelism: divides the layers per stage.")
    cp: int = Field(1, ge=1, description="Context parallelism: divides each sample's tokens.")
    ep: int = Field(16, ge=1, description="Expert parallelism (report: maximal at 16).")
    etp: int = Field(1, ge=1, description="Expert tensor parallelism.")
    dp: int | None = Field(None, ge=1, description="Requested data parallelism; None derives it. DP = 1 is checked against the expert identity.")
    distributed_optimizer: bool = Field(True, description="Shard optimizer state over the data-parallel group.")

    @model_validator(mode="after")
    def _layout_divides(self) -> "Parallelism":
        errors = plan_errors(self.train_gpus, self.tp, self.pp, self.cp, self.etp, self.dp)
        if errors:  # the same rules validate a campaign's [trainer.parallel] (t1ops.parallel_layout)
            raise ValueError("; ".join(errors))
        return self

    @property
    def derived_dp(self) -> int:
        return self.train_gpus // (self.tp * self.pp * self.cp)

    @property
    def expert_dp(self) -> float:
        """Expert data parallelism train_gpus / (pp * ep * etp); not an integer means an invalid layout."""
        return self.train_gpus / (self.pp * self.ep * self.etp)


class BatchPlan(Section):
    """What the trainer consumes per step."""

    context_wall_tokens: int = Field(86_016, ge=1, description="Token wall per sample (report: 84k = 86,016).")
    longest_sample_tokens: int | None = Field(None, ge=1, description="Longest indivisible sample to plan for; None = the wall.")
    max_tokens_per_gpu: int = Field(8192, ge=1, description="Dynamic packer cap per GPU (report: 8192, once lowered to 4096).")
    samples_per_step: int = Field(512, ge=1, description="Trajectories per step (report: 512).")
    mean_sample_tokens: int = Field(33_000, ge=1, description="Mean trajectory length, for routing-record staging (report's example: 33k).")

    @model_validator(mode="after")
    def _longest_within_wall(self) -> "BatchPlan":
        if self.longest_sample_tokens is not None and self.longest_sample_tokens > self.context_wall_tokens:
            raise ValueError(f"longest_sample_tokens {self.longest_sample_tokens} > context_wall_tokens "
                             f"{self.context_wall_tokens}; the wall truncates samples")
        return self

    @property
    def binding_sample_tokens(self) -> int:
        return self.longest_sample_tokens or self.context_wall_tokens


class PrecisionPlan(Section):
    """Bytes per parameter and what is offloaded."""

    param_bytes: int = Field(2, ge=1, le=4, description="Weight bytes (bf16: 2).")
    main_grad_bytes: int = Field(4, ge=2, le=4, description="Gradient-buffer bytes (report: fp32 accumulation, 4).")
    optimizer_bytes_per_param: int = Field(12, ge=0, le=16, description="fp32 master + Adam m + v = 12.")
    optimizer_offload_fraction: float = Field(0.0, ge=0, le=1, description="Share of optimizer state kept in host RAM (CPU Adam).")
    full_recompute: bool = Field(True, description="Keep only each layer's input; recompute the rest in backward.")
    gdn_native_cp: bool = Field(True, description="GatedDeltaNet has native context parallelism (report section 08); without it CP must be 1.")
    r3: bool = Field(True, description="Routing replay: the rollout's routing record is staged on the trainer.")


class RolesPlan(Section):
    """Actor and a same-size critic time-sharing the GPUs by forced offload (report section 05)."""

    critic: bool = Field(True, description="PPO with a separate, same-size critic (value head on the last stage).")
    critic_only_steps: int = Field(2, ge=0, description="Critic-only re-calibration steps before joint steps (report: 2).")


class HardwarePlan(Section):
    """Memory of the machines (the upper bounds keep the memory model's arithmetic finite)."""

    gpu_memory_gib: float = Field(95.0, gt=0, le=16_384, description="Usable memory per GPU (report: 95 GiB).")
    host_ram_gib: float = Field(2265.0, gt=0, le=1_048_576, description="RAM per train node (report: 2265 GB).")
    host_base_gib: float = Field(64.0, ge=0, le=1_048_576, description="RAM the OS, Ray and the trainer processes use besides offloaded state.")
    sandbox_workers_per_train_node: int = Field(0, ge=0, description="Concurrent sandbox workers on a train node (report's OOM kill: 260).")
    sandbox_worker_gib: float = Field(SANDBOX_WORKER_GIB, ge=0, le=1_048_576, description="RSS of one sandbox worker (not published; fit in calibration.py).")


class Plan(Section):
    """The root of a plan file (``examples/plans/*.toml``)."""

    FILE_KIND: ClassVar[FileKind] = FileKind("cluster plan", "t1ops preflight --schema",
                                             "examples/plans/qwen35-122b-128gpu-cp4.toml", "t1ops preflight")

    model: ModelShape = Field(default_factory=ModelShape, description="Model shape.")
    parallelism: Parallelism = Field(default_factory=Parallelism, description="Training layout.")
    batch: BatchPlan = Field(default_factory=BatchPlan, description="Per-step batch.")
    precision: PrecisionPlan = Field(default_factory=PrecisionPlan, description="Precision and offload.")
    roles: RolesPlan = Field(default_factory=RolesPlan, description="Actor and critic.")
    hardware: HardwarePlan = Field(default_factory=HardwarePlan, description="GPU and host memory.")

    @model_validator(mode="after")
    def _layers_split(self) -> "Plan":
        error = layers_split(self.model.num_layers, self.parallelism.pp)
        if error:
            raise ValueError(error)
        return self

    @property
    def layers_per_stage(self) -> int:
        return self.model.num_layers // self.parallelism.pp


def load_plan(path: str | Path) -> Plan:
    """Load and validate a plan file; raises ConfigError naming the bad key."""
    return load_toml(path, model=Plan)
