"""Loopback ports for engine processes (kept apart from the engine so callers stay light).

``free_port`` probes a port that a child process binds a moment later, so something else can take it
in between. The usual taker is not another server but any outgoing connection: the kernel gives each
client socket a port from its ephemeral range (``net.ipv4.ip_local_port_range``, 32768-60999 here),
and a port found by binding port 0 comes from that same range. With many HTTP clients, Ray and gloo
connections on the host, the two met (seen in CI: an engine and a rank-0 TCPStore died of
EADDRINUSE). So the port is drawn at random below the ephemeral range, where the kernel never hands
out client ports, and only another ``free_port`` caller can pick it too (1 in ~12,000 per pair).
Launchers still start an engine again on a fresh port when it exits with :data:`PORT_TAKEN_EXIT`.
"""
from __future__ import annotations

import random
import socket

_RANDOM = random.SystemRandom()  # not the random module's state, which a forked child shares
_FLOOR = 20_000                   # above Ray's worker ports (10002-19999 by default) and the well-known ones


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host``, below the kernel's ephemeral range where it has room."""
    low = _ephemeral_low()
    if low - _FLOOR >= 1_000:
        for _ in range(100):
            port = _RANDOM.randrange(_FLOOR, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # no room below: the kernel's choice
        sock.bind((host, 0))
        return int(sock.getsockname()[1])

# the exit status of an engine process whose port was taken before it could bind (free_port's race);
# its launcher starts it again on a fresh port (t1ops.engines.slots.spawn_factory)
PORT_TAKEN_EXIT = 98
