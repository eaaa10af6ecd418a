"""Background work that nobody awaits must report its death (docs/engine.md, "Background loops").

SkyRL issue #1691 (github.com/NovaSky-AI/SkyRL/pull/1691): an engine died inside an
``asyncio.create_task`` whose exception nobody awaited; the process stayed alive, the GPUs
idle, no error anywhere. The same shape exists wherever a loop runs on a thread or task the
caller never joins: the embedded engine's batch scheduler (every ``/generate`` waits on it),
the engine pool's pinger, its ping and spawn futures.

:func:`supervised_thread` runs such a loop so that an exception ending it is never lost: it is
printed with its traceback and handed to ``on_death`` (the engine marks itself failed and
fails every waiting request; the pool records it and keeps pinging). :func:`report_errors`
does the same for a future nobody calls ``result()`` on.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import traceback
from typing import Callable

from rl.errors import EngineError


class EngineFailedError(EngineError):
    """The engine's background generation loop died: it cannot finish any request (HTTP 503).

    The process is alive and answers ``/health`` transport-wise; callers must treat the engine
    as dead (take it out of rotation, resubmit its requests, recreate it)."""


def supervised_thread(loop: Callable[[], None], *, name: str, on_death: Callable[[str], None],
                      supervised: bool = True) -> threading.Thread:
    """A started daemon thread running ``loop``; an exception ending it calls ``on_death(reason)``.

    ``supervised=False`` runs the loop bare (the behaviour before the guard: the thread dies, its
    traceback goes to stderr at most, and nobody is told); only the chaos harness asks for it.
    """
    def run() -> None:
        try:
            loop()
        except BaseException as exc:  # noqa: BLE001 -- whatever ends the loop is its death, reported
            reason = f"background loop {name!r} died: {type(exc).__name__}: {exc}"
            traceback.print_exc()
            print(reason, flush=True)
            on_death(reason)

    thread = threading.Thread(target=run if supervised else loop, name=name, daemon=True)
    thread.start()
    return thread


def report_errors(future: cf.Future, on_error: Callable[[str], None], what: str) -> cf.Future:
    """Call ``on_error(reason)`` when ``future`` ends with an exception (a done-callback); returns it."""
    def done(fut: cf.Future) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            on_error(f"{what} raised {type(exc).__name__}: {exc}")
    future.add_done_callback(done)
    return future
