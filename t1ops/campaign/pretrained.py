"""The trainer's start from a Hugging Face checkpoint (``[model] path``, docs/model.md)."""
from __future__ import annotations

from rl.errors import DataContractError
from rl.hf.checkpoint import export_vocab
from rl.hf.reader import CheckpointState, HFCheckpoint
from rl.vocab import CompactVocab


def pretrained_states(model_path: str, vocab: CompactVocab, with_critic: bool):
    """(actor, critic or None) full states read on demand from a Hugging Face checkpoint (``[model] path``):
    the actor is the checkpoint, the critic its trunk with a fresh value head (docs/model.md). A rank that
    loads its shard reads only the units it holds (``rl.hf.reader.CheckpointState``)."""
    checkpoint = HFCheckpoint(model_path)
    own = export_vocab(model_path)
    if own is not None:  # rows already indexed by this compact vocabulary: taken as they are
        if own != vocab:
            raise DataContractError(f"{model_path} was exported with another compact vocabulary than this run's "
                                    f"({own.size} vs {vocab.size} ids)", path=model_path)
        vocab = None
    if checkpoint.set_aside:  # said once: the vision tower and MTP layers are not part of the policy
        print(f"model.path: {len(checkpoint.set_aside)} tensor(s) outside the policy set aside "
              f"(first: {checkpoint.set_aside[0]})", flush=True)
    return (CheckpointState(checkpoint, vocab), CheckpointState(checkpoint, vocab, role="critic") if with_critic else None)
