"""The ``[model]`` section: a Hugging Face checkpoint (``path``) whose config.json fills the shape, or the
shape of a random init (docs/model.md). Part of :mod:`t1ops.config`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from t1ops.config_section import Section


class ModelConfig(Section):
    """The model: a Hugging Face checkpoint (``path``) or the shape of a random init (docs/model.md)."""

    path: str | None = Field(None, description="Hugging Face checkpoint directory (config.json, *.safetensors, sharded or not, tokenizer.json) the trainer and engines start from; its config.json decides the architecture (qwen3_5_moe, qwen3_moe) and the shape, which fill the fields below (a field set to another value is refused). `t1ops model init` writes a small one. None: a random-init qwen3_moe of the fields below.")
    num_layers: int = Field(2, ge=1, le=128, description="Transformer layers (all MoE).")
    hidden_size: int = Field(64, ge=8, le=16384, description="Hidden size.")
    num_attention_heads: int = Field(4, ge=1, le=256, description="Attention heads.")
    num_query_groups: int = Field(2, ge=1, le=256, description="Key/value heads (grouped-query attention; divides num_attention_heads).")
    ffn_hidden_size: int = Field(128, ge=8, description="Dense FFN size.")
    num_experts: int = Field(8, ge=2, le=1024, description="Routed experts per MoE layer.")
    moe_router_topk: int = Field(2, ge=1, le=64, description="Experts selected per token (top-k).")
    moe_ffn_hidden_size: int = Field(64, ge=8, description="Per-expert FFN size.")
    max_seq_len: int = Field(2048, ge=64, le=1_048_576, description="Positional capacity in tokens.")
    vocab_size: int = Field(248_320, ge=256, description="Vocabulary size (Qwen3.5 tokenizer: 248,320).")
    _spec: Any = PrivateAttr(default=None)  # the checkpoint's rl.model.ModelSpec (every architecture field)

    @model_validator(mode="after")
    def _from_checkpoint(self) -> ModelConfig:
        if self.path is None:
            return self
        from rl.errors import CheckpointError
        from rl.hf.layout import spec_from_config
        from rl.hf.reader import read_config

        config_json = Path(self.path) / "config.json"
        try:
            spec = spec_from_config(read_config(self.path), where=str(config_json))
        except CheckpointError as exc:
            raise ValueError(f"model.path: {exc}") from None
        shape = [name for name in type(self).model_fields if name != "path"]
        clash = [f"model.{k} = {getattr(self, k)} (checkpoint: {getattr(spec, k)})"
                 for k in sorted(self.model_fields_set & set(shape)) if getattr(self, k) != getattr(spec, k)]
        if clash:
            raise ValueError(f"model.path takes the shape from {config_json}; remove {', '.join(clash)}")
        for name in shape:  # every reader of [model] sees the checkpoint's shape
            object.__setattr__(self, name, getattr(spec, name))
        self._spec = spec
        return self

    def model_spec(self):
        """The :class:`rl.model.ModelSpec`: the checkpoint's, or a random-init qwen3_moe of these fields."""
        from rl.model import ModelSpec

        return self._spec if self._spec is not None else ModelSpec.from_config(self)
