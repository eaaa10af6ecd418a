"""The model's tensors: the state dict checkpoints hold, all-or-nothing loading, ``weights.pt`` files."""
from __future__ import annotations

from pathlib import Path

import torch

from rl.atomic import publish_file
from rl.errors import CheckpointError

WEIGHTS_FILE = "weights.pt"


def weights_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's tensors by name: ``state_dict()`` minus megatron's ``_extra_state`` entries.

    megatron modules add ``<name>._extra_state`` (None for the local spec: no
    FP8 metadata) to ``state_dict()``; checkpoints hold tensors only.
    """
    return {name: value for name, value in model.state_dict().items() if isinstance(value, torch.Tensor)}


def load_state(model, state: dict[str, torch.Tensor], source: str = "<state>") -> None:
    """Copy ``state`` (as from ``weights_state_dict``) into ``model``, all or nothing.

    Names and shapes are checked before any copy: ``load_state_dict`` copies
    tensor by tensor, so a late mismatch would leave a half-updated (served)
    model. dtypes are cast to the model's (fp32 checkpoint into a bf16 engine).
    """
    current = model.state_dict()
    expected = weights_state_dict(model)
    wrong = sorted(set(state) ^ set(expected)) or [
        name for name, tensor in state.items()
        if not isinstance(tensor, torch.Tensor) or tensor.shape != expected[name].shape
    ]
    if wrong:
        raise CheckpointError(
            f"{source} does not fit this model: {len(wrong)} tensor(s) differ in name or shape "
            f"(first: {wrong[:3]}); build the model with the checkpoint's ModelSpec",
            path=source, mismatched=wrong[:10],
        )
    extras = {name: value for name, value in current.items() if name not in expected}
    model.load_state_dict({**extras, **state}, strict=True)


def save_weights(model, directory: str | Path) -> Path:
    """Write ``directory/weights.pt`` (``weights_state_dict``) atomically; return its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = weights_state_dict(model)
    return publish_file(directory / WEIGHTS_FILE, lambda f: torch.save(state, f))


def load_weights(model, directory: str | Path) -> None:
    """Load ``directory/weights.pt`` into ``model`` via ``load_state``."""
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(f"no {WEIGHTS_FILE} in {directory}; save_weights() writes it", path=str(path))
    load_state(model, torch.load(path, map_location="cpu", weights_only=True), source=str(path))
