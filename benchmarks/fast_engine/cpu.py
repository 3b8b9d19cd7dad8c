"""CPU seconds each process of a peer spent, by role, from /proc: the processes carrying the peer's marker (its
``RAY_TMPDIR``, which every process it starts inherits: ``harness.procs``), so the serving layer's cost per token is
a number beside the engine's, and each process's own (by :func:`name`), so that what Ray's processes spend one by one
is in the results too. :class:`Sampler` takes snapshots through a client run, so that only its measured phase is
counted (not the client's start-up, when vLLM's CPU engine still spends some CPU waiting)."""

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


def name(title: str) -> str:
    """A process's short name by its command line: a Ray worker's or vLLM's own title without its method
    (``ray::ServeController.listen_for_change``: ``ServeController``; ``VLLM::Worker``), a Python script's file name
    or module, else the program's (Ray's daemons, HAProxy, the dashboard's modules)."""
    words = title.split()
    if not words:
        return "?"
    first = words[0]
    if first.startswith(("ray::", "VLLM::")):
        return first.removeprefix("ray::").split(".")[0]
    if first.rsplit("/", 1)[-1].startswith("python"):
        for word, after in zip(words[1:], [*words[2:], ""]):
            if word in ("-c", "-m"):
                return after if word == "-m" else "python -c"
            if not word.startswith("-"):
                return word.rsplit("/", 1)[-1]
        return "python"
    return first.rsplit("/", 1)[-1]


Snapshot = dict[tuple[int, int], tuple[str, str, float]]
"""Each process (by pid and start time, so a reused pid is another process): its role, its name and its CPU seconds
so far."""


def snapshot(marker: str) -> Snapshot:
    """Each process of the peer: its role, name and CPU seconds so far. A Serve replica's engine is told by parentage
    as well as by title: one run of the app had its engine's processes under titles other than vLLM's, and counted
    them as Ray's."""
    table = processes(marker)
    apps = {pid for app in APPS for pid in replicas(table, app)}
    engines = set().union(*(engine_of(table, pid) for pid in apps))
    return {
        (pid, proc.start): ("engine" if pid in engines else role(proc.title), name(proc.title), proc.cpu_s)
        for pid, proc in table.items()
    }


def spent(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds by role between two snapshots (a process started between them counts from its start; one that
    ended between them is not counted)."""
    return {**dict.fromkeys(ROLES, 0.0), **_summed(before, after, 0)}


def spent_by_name(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds by process name (:func:`name`; processes of one name summed), counted as :func:`spent`
    counts them."""
    return _summed(before, after, 1)


def _summed(before: Snapshot, after: Snapshot, field: int) -> dict[str, float]:
    """Each process's CPU seconds between the snapshots, summed by its role (``field`` 0) or name (1)."""
    out: dict[str, float] = {}
    for key, entry in after.items():
        out[entry[field]] = out.get(entry[field], 0.0) + entry[2] - (before[key][2] if key in before else 0.0)
    return out


class Sampler:
    """Snapshots of a peer's processes every ``interval_s`` in a thread, from ``start()`` to ``stop()``;
    :meth:`spent_between` gives the CPU by role between two moments (``time.monotonic()``), from the snapshots
    nearest outside them."""

    def __init__(self, marker: str, interval_s: float = 0.5) -> None:
        self.marker, self.interval_s = marker, interval_s
        self.times: list[float] = []
        self.snapshots: list[Snapshot] = []
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
        return spent(*self._around(start, end))

    def by_name_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds by process name over the same snapshots as :meth:`spent_between`."""
        return spent_by_name(*self._around(start, end))

    def _around(self, start: float, end: float) -> tuple[Snapshot, Snapshot]:
        first = max(0, bisect.bisect_right(self.times, start) - 1)
        last = min(len(self.times) - 1, bisect.bisect_left(self.times, end))
        return self.snapshots[first], self.snapshots[last]
