"""``t1ops engine serve --openai``: the OpenAI endpoint in front of one local engine.

The embedded engine serves its SGLang API on a private loopback port; the
endpoint talks to it through :class:`~rl.engines.client.EngineClient`, exactly
as a campaign's sessions talk to the pool. Sessions open on first sight, one
per path prefix (``/s/<name>/v1``) or ``user`` field (else ``default``).
With ``dump_dir`` every session's trajectory is rewritten there after each
turn (``<session>.c<chunk>.npz``, the audit's format).
"""
from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path

import httpx

from rl.chat import ChatRenderer
from rl.engines.client import EngineClient
from rl.engines.embedded import serve
from rl.engines.embedded_engine import EmbeddedEngine
from rl.engines.ports import free_port
from rl.harness.server import SAFE_SESSION, OpenAIServer, SessionRegistry
from rl.harness.session import HarnessSession, SessionLimits


def dump_name(session_id: str) -> str:
    """A file-name stem for ``session_id`` that stays inside the dump dir: the id itself when
    it is a plain name (``[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}``), else its safe characters and
    a hash of the whole id (a ``user`` field of ``../../x`` becomes ``x-<hash>``)."""
    if SAFE_SESSION.fullmatch(session_id) and len(session_id) <= 64:
        return session_id
    clean = re.sub(r"[^A-Za-z0-9_-]+", "_", session_id)[:40].strip("_") or "session"
    return f"{clean}-{hashlib.sha256(session_id.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


def write_session(session: HarnessSession, dump_dir: Path) -> None:
    """Rewrite ``session``'s chunks as ``<session>.c<chunk>.npz`` (numpy; the audit's format),
    named by :func:`dump_name`: never a path outside ``dump_dir``."""
    import json

    import numpy as np

    dump_dir.mkdir(parents=True, exist_ok=True)
    for traj in session.finish():
        meta = {**traj.meta, "harness": session.stats()}
        routing = traj.routing if traj.routing is not None else np.zeros((0,), dtype=np.int32)
        path = dump_dir / f"{dump_name(str(meta['sample_id']))}.c{int(meta['chunk_id'])}.npz"
        if path.parent != dump_dir:
            raise ValueError(f"dump name for session {meta['sample_id']!r:.80} leaves {dump_dir}")
        np.savez_compressed(path, tokens=traj.tokens,
                            loss_mask=traj.loss_mask, rollout_logprobs=traj.rollout_logprobs,
                            engine_tokens=traj.engine_tokens, origin=traj.origin,
                            policy_version=traj.policy_version, routing=routing, meta=np.array(json.dumps(meta)))


IDLE_SESSION_S = 3600.0   # a session opened on first sight and unused this long is dropped


def serve_openai(engine: EmbeddedEngine, host: str, port: int, *, limits: SessionLimits,
                 dump_dir: str | None = None) -> None:
    """Block serving ``/v1/chat/completions`` on ``host:port`` in front of ``engine``."""
    engine_port = free_port()
    threading.Thread(target=serve, args=(engine, "127.0.0.1", engine_port), daemon=True, name="engine").start()
    client = EngineClient(f"http://127.0.0.1:{engine_port}", httpx.Client(timeout=None),
                          num_moe_layers=engine.spec.num_layers, topk=engine.spec.moe_router_topk,
                          num_experts=engine.spec.num_experts)
    renderer = ChatRenderer.default()
    registry = SessionRegistry(factory=lambda name: HarnessSession(name, client.generate, renderer, limits),
                               idle_s=IDLE_SESSION_S)
    on_turn = None if dump_dir is None else (lambda s: write_session(s, Path(dump_dir)))
    server = OpenAIServer(registry, host=host, port=port, on_turn=on_turn)
    print(f"OpenAI endpoint ready on {server.base_url} (sessions: {server.base_url[:-3]}/s/<name>/v1 or the "
          f"'user' field; engine {engine.spec.num_layers}-layer MoE, weight_version {engine.weight_version})",
          flush=True)
    server.serve_forever()
