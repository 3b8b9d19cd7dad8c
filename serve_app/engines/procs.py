"""The process table as Linux's /proc shows it: who started whom, and which process group each is in. The CPU
tuning uses it to find a replica's engine processes (:func:`descendants`), the reaper to find what is left of a
worker's process group, and the benchmarks and tests to find what a server left behind."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
"""/proc's time unit, per second."""


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it. ``pid`` and ``start`` (clock ticks after boot) together name one process
    even after its pid is reused; ``title`` is its command line, which Ray's workers and vLLM's processes
    rewrite (``ray::ServeReplica:llm:LLMServer``, ``VLLM::EngineCore``): ``comm`` cuts those at 15 bytes.
    ``cpu_s``: the user and system CPU seconds it had spent when read."""

    pid: int
    ppid: int
    pgid: int
    state: str
    start: int
    title: str
    cpu_s: float


def read_proc(pid: int) -> Proc | None:
    """``pid``'s entry, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return Proc(pid, int(fields[1]), int(fields[2]), fields[0], int(fields[19]), title, cpu_s)


def process_table() -> dict[int, Proc]:
    """Every process there is, by pid (none where there is no /proc: not Linux)."""
    entries = os.scandir("/proc") if os.path.isdir("/proc") else ()
    return {int(e.name): proc for e in entries if e.name.isdigit() and (proc := read_proc(int(e.name)))}


def descendants(table: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    """Every process in ``table`` below ``roots`` (children, their children, ...), the roots excluded."""
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    roots = set(roots)
    found: set[int] = set()
    below = [child for root in roots for child in children.get(root, [])]
    while below:
        pid = below.pop()
        if pid not in found and pid not in roots:
            found.add(pid)
            below += children.get(pid, [])
    return found
