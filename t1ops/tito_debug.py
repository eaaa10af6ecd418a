"""The per-trajectory TITO debug dump (``rollout.debug_dump``; SkyRL walkthrough, section 5).

For each trajectory, ``<dir>/<sample_id>/``:

- ``tito_transitions.json``: one entry per turn of every chunk: the chunk, the turn's
  relation (strict / normalized / retokenized / split), the stream positions it added
  ``[start, end)``, its loss-bearing count, and the normalized repair if one was made;
  plus the trial's reward, source and end reason. It locates which turn misaligned.
- ``tito_debug.txt``: each chunk's stream decoded with its special tokens, loss-bearing
  spans between ``[[`` and ``]]``, so a doubled stop token or a missing newline is visible.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path


def transitions(result) -> list[dict]:
    """The turn-by-turn transitions of one trial's chunks (a ``TrialResult``; see the module docstring)."""
    out = []
    for chunk in result.chunks:
        meta = chunk.meta
        repairs = {r["turn"]: r for r in meta.get("repairs", [])}
        turn0 = len(out)
        for k, (start, end, relation) in enumerate(meta.get("turn_spans", [])):
            out.append({"chunk": meta.get("chunk_id", 0), "turn": turn0 + k, "relation": relation,
                        "span": [int(start), int(end)],
                        "loss_tokens": int(chunk.loss_mask[start:end].sum()),
                        "repair": repairs.get(turn0 + k)})
    return out


def render(chunk, decode) -> str:
    """A chunk's stream with special tokens; loss-bearing runs wrapped in [[ ]]."""
    text, run, inside = [], [], False
    for tok, m in zip(chunk.tokens.tolist(), chunk.loss_mask.tolist()):
        if bool(m) != inside:
            text.append(decode(run) + ("[[" if m else "]]"))
            run, inside = [], bool(m)
        run.append(tok)
    text.append(decode(run) + ("]]" if inside else ""))
    return "".join(text)


@functools.lru_cache(maxsize=1)
def _default_decode():
    from rl.chat import ChatRenderer

    return ChatRenderer.default().tokenizer.decode


def write_debug(root: Path, result, decode=None) -> Path:
    """Write one trial's (a ``TrialResult`` with its chunks) ``tito_transitions.json`` and
    ``tito_debug.txt``; returns its directory."""
    decode = decode or _default_decode()
    out = Path(root) / str(result.sample_id)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"sample_id": result.sample_id, "task": result.task, "reward": result.reward,
           "reward_source": result.reward_source, "end_reason": result.end_reason,
           "num_chunks": len(result.chunks), "transitions": transitions(result)}
    (out / "tito_transitions.json").write_text(json.dumps(doc, indent=1))
    (out / "tito_debug.txt").write_text("\n\n".join(
        f"=== chunk {c.meta.get('chunk_id', i)} ===\n{render(c, decode)}" for i, c in enumerate(result.chunks)))
    return out
