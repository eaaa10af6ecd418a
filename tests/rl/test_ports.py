"""rl/engines/ports.py: a probed port is drawn below the kernel's ephemeral range (client sockets
never take it between the probe and the child's bind), and falls back to the kernel where there is no room."""
from __future__ import annotations

import socket

from rl.engines import ports


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    low = ports._ephemeral_low()
    got = {ports.free_port() for _ in range(20)}
    assert all(ports._FLOOR <= p < low for p in got), (sorted(got), low)
    assert len(got) > 1  # drawn at random, not a fixed sequence
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", got.pop()))


def test_no_room_below_the_range_falls_back_to_the_kernels_choice(tmp_path, monkeypatch):
    wide = tmp_path / "range"
    wide.write_text("1024\t65535\n")
    assert ports._ephemeral_low(str(wide)) == 1024
    assert ports._ephemeral_low(str(tmp_path / "missing")) == 32_768
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: 1024)
    assert 1024 <= ports.free_port() <= 65535
