"""Two embedded engine processes and their clients, for a module's weight-sync tests."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx

from rl.engines.client import EngineClient
from rl.engines.embedded_spawn import spawn
from rl.engines.ports import free_port


def engine_pair(spec, dtype: str, logs: Path) -> Iterator[list[tuple[int, EngineClient]]]:
    """Yield ``[(slot, client)]`` of two engines (seeds 99 and 100) serving ``spec`` in ``dtype``; kill
    them when the generator closes."""
    procs = [spawn(free_port(), spec, dtype=dtype, seed=99 + i, log_path=logs / f"engine{i}.log") for i in range(2)]
    http = httpx.Client(timeout=120)
    try:
        yield [(i, EngineClient(p.url, http)) for i, p in enumerate(procs)]
    finally:
        for p in procs:
            p.kill()
            p.wait()
        http.close()
