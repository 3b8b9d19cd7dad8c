"""CPU seconds each process of a peer spent, by role, from /proc: the processes carrying the peer's marker (its
``RAY_TMPDIR``, which every process it starts inherits: ``harness.procs``), so the serving layer's cost per token is
a number beside the engine's. :class:`Sampler` takes snapshots through a client run, so that only its measured
phase is counted (not the client's start-up, when vLLM's CPU engine still spends some CPU waiting)."""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any

from harness.procs import engine_of, processes, replicas

ROLES = ("engine", "replica", "proxy", "api server", "agent", "other")
"""``engine``: vLLM's engine processes (``VLLM::EngineCore``, which schedules, and ``VLLM::Worker``, which computes on
the CPU build), the embedding app's idle one included; ``replica``: the generation app's Serve replica (ingress,
batcher, vLLM's output processing); ``proxy``: HAProxy, its manager actor, Serve's proxy actor; ``api server``:
vLLM's own server process; ``agent``: Ray's dashboard agent, through which every Ray metric of the node's processes
(vLLM's engine metrics included) passes on its way to the metrics endpoint; ``other``: the rest (Ray's daemons,
Serve's controller, the embedding app's replica)."""


APPS = ("llm", "embeddings")
"""The shipped config's applications, whose replicas' engines :func:`snapshot` finds by parentage."""


def role(title: str) -> str:
    """The role of a process by its command line (Ray's workers and vLLM's processes rename themselves)."""
    if title.startswith(("VLLM::EngineCore", "VLLM::Worker")):
        return "engine"
    if "ServeReplica:llm:" in title:
        return "replica"
    if "haproxy" in title.lower() or "ProxyActor" in title:
        return "proxy"
    if "DashboardAgent" in title:
        return "agent"
    if "vllm.entrypoints.openai.api_server" in title or "APIServer" in title:
        return "api server"
    return "other"


def snapshot(marker: str) -> dict[tuple[int, int], tuple[str, float]]:
    """Each process of the peer (by pid and start time, so a reused pid is another process): its role and CPU
    seconds so far. A Serve replica's engine is told by parentage as well as by title: one run of the app had its
    engine's processes under titles other than vLLM's, and counted them as Ray's."""
    table = processes(marker)
    apps = {pid for app in APPS for pid in replicas(table, app)}
    engines = set().union(*(engine_of(table, pid) for pid in apps))
    return {
        (pid, proc.start): ("engine" if pid in engines else role(proc.title), proc.cpu_s) for pid, proc in table.items()
    }


def spent(before: dict[tuple[int, int], tuple[str, float]], after: dict) -> dict[str, float]:
    """CPU seconds by role between two snapshots (a process started between them counts from its start; one that
    ended between them is not counted)."""
    out = dict.fromkeys(ROLES, 0.0)
    for key, (name, seconds) in after.items():
        out[name] += seconds - before.get(key, (name, 0.0))[1]
    return out


class Sampler:
    """Snapshots of a peer's processes every ``interval_s`` in a thread, from ``start()`` to ``stop()``;
    :meth:`spent_between` gives the CPU by role between two moments (``time.monotonic()``), from the snapshots
    nearest outside them."""

    def __init__(self, marker: str, interval_s: float = 0.5) -> None:
        self.marker, self.interval_s = marker, interval_s
        self.times: list[float] = []
        self.snapshots: list[dict[tuple[int, int], tuple[str, float]]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            snap = snapshot(self.marker)
            self.times.append(time.monotonic())
            self.snapshots.append(snap)
            if self._done.wait(self.interval_s):
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()

    def spent_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds by role from the last snapshot at or before ``start`` to the first at or after ``end``
        (the first and last snapshots where there is none)."""
        first = max(0, bisect.bisect_right(self.times, start) - 1)
        last = min(len(self.times) - 1, bisect.bisect_left(self.times, end))
        return spent(self.snapshots[first], self.snapshots[last])
