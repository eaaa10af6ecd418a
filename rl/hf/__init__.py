"""Hugging Face layout of the policy: Qwen3-MoE config, exact name/shape map, safetensors export/import.

- :mod:`rl.hf.qwen3_moe`: ``config.json`` of a :class:`~rl.model.ModelSpec` and the
  megatron-core <-> Hugging Face tensor map (both directions, in conversion units).
- :mod:`rl.hf.checkpoint`: ``export_hf`` / ``import_hf`` of a directory in the layout
  ``transformers`` and SGLang load (``config.json`` + ``model.safetensors`` + tokenizer files).
- :mod:`rl.hf.tokenizer`: the tokenizer files (``tokenizer.json``) of the Qwen tokenizer.

See ``docs/weights.md``.
"""
