"""The ports the suite and the benchmarks give their servers (``harness.ports.free_port``): below the
kernel's ephemeral range, where no outgoing connection's local end can take one between the pick and the server's
bind (CI once saw Serve's HAProxy fail to bind a port the kernel had handed out for port 0), and never one twice."""

from __future__ import annotations

import socket

from harness import ports
from harness.ports import RAY_WORKER_PORTS_END, ephemeral_ports, free_port


def test_ports_lie_below_the_ephemeral_range_above_rays_workers_and_are_never_handed_out_twice():
    low, _ = ephemeral_ports()
    ports = [free_port() for _ in range(50)] + [free_port("") for _ in range(10)]
    assert len(set(ports)) == len(ports)
    assert all(RAY_WORKER_PORTS_END <= port < low for port in ports), ports
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: a server can bind it


def test_a_port_someone_listens_on_is_not_picked(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "_handed_out", set())  # as a fresh process: the busy port is a candidate
        monkeypatch.setattr(ports, "RAY_WORKER_PORTS_END", busy)
        monkeypatch.setattr(ports, "ephemeral_ports", lambda: (busy + 1, 60999))  # the only candidate
        assert free_port() != busy


def test_without_room_below_the_range_the_kernel_picks(monkeypatch):
    low, high = ephemeral_ports()
    monkeypatch.setattr(ports, "ephemeral_ports", lambda: (RAY_WORKER_PORTS_END, high))
    assert low <= free_port() <= high  # the kernel's pick: in its ephemeral range
