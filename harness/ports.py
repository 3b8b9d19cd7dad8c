"""Ports for the servers tests and benchmarks start: picked below the kernel's ephemeral range, so that no outgoing
connection can take one between the pick and the server's bind."""

from __future__ import annotations

import random
import socket
from contextlib import suppress
from pathlib import Path

RAY_WORKER_PORTS_END = 20000
"""Ray's worker processes listen on 10002-19999 by default (``--min/max-worker-port``): a port is picked above."""
_handed_out: set[int] = set()
_picker = random.Random()
"""Ports are picked with a generator of their own: the ``random`` module's shared state is left to the caller (a
seeded test, or Hypothesis, which takes a change of it during a draw for a strategy's own use)."""


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for the local end of outgoing connections (Linux's own default elsewhere)."""
    with suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` (``""``: on any interface) now, below the kernel's ephemeral range
    and above Ray's worker ports, never the same one twice in a process. A port the kernel gives for port 0 lies
    in the ephemeral range, where any process's outgoing connection can take it before the server binds it (CI
    saw Serve's HAProxy fail with "Address already in use" on one); below it only a server binding it by number
    can."""
    low = ephemeral_ports()[0]
    candidates = [port for port in range(RAY_WORKER_PORTS_END, low) if port not in _handed_out]
    for port in _picker.sample(candidates, min(len(candidates), 200)):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as sock:  # no room below the range on this machine: the kernel's pick
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_taken(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port`` (a new server could not bind it); connections left in
    TIME_WAIT do not count."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False
