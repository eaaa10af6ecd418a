"""Loopback ports for engine processes (kept apart from the engine so callers stay light)."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (the caller races other binders; fine on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])

# the exit status of an engine process whose port was taken before it could bind (free_port's race);
# its launcher starts it again on a fresh port (t1ops.engines.slots.spawn_factory)
PORT_TAKEN_EXIT = 98
