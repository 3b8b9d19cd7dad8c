"""Finding and stopping what a server started as a subprocess left behind, so no run leaks into the next.

A peer runs in its own process group with a private marker in its environment (its ``RAY_TMPDIR``). Every
process it starts inherits that environment, whoever its parent is: Ray's daemons, its workers (each in a
process group of its own since Ray 2.60) and the ``VLLM::EngineCore`` / ``VLLM::Worker`` processes a replica
starts. That is how :func:`own_leftovers` and :func:`processes` find them, and :func:`descendants` tells which
of them a given replica started (its engine).

Ray itself kills a worker's engine when the worker goes, however it goes (``serve.env`` pins how:
``RAY_process_group_cleanup_enabled``, ``RAY_kill_child_processes_on_worker_exit``); :func:`stop` is the last
resort after a run, and returns whatever it still had to kill.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import Any

from serve_app.engines.procs import Proc, descendants, process_table, read_proc

DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"
)
"""Exec the rest of the command line with SIGINT at its default disposition (Python then installs its own handler,
as it does under a terminal's shell)."""


def spawn(argv: list[str], **popen: Any) -> subprocess.Popen:
    """``argv`` in a process group of its own, as a terminal's shell starts a command: SIGINT at its default, so
    :func:`stop`'s Ctrl-C (SIGINT to the group) is acted on. Without the reset a server would inherit SIGINT
    *ignored* whenever this process runs as a background job of a non-interactive shell (``make test &`` in a
    script): POSIX has such a shell ignore SIGINT in what it starts, and Python keeps an ignored SIGINT ignored."""
    return subprocess.Popen([sys.executable, "-c", DEFAULT_SIGINT, *argv], start_new_session=True, **popen)


def own_leftovers(marker: str) -> list[int]:
    """The pids of :func:`processes`: what a server that ran with ``marker`` left behind."""
    return sorted(processes(marker))


def processes(marker: str) -> dict[int, Proc]:
    """The processes that name ``marker`` in their command line or environment (this process excepted), by pid:
    Ray's daemons and workers (a worker renames itself ``ray::...`` but keeps the environment it inherited) and
    the engine processes those workers started; and every process below one of them. A process that sets its
    title may overwrite its environment's memory with it (Ray's dashboard agent and the dashboard's modules, some
    runs and not others), which is what /proc shows; its parent still carries the marker."""
    table = process_table()
    marked = set()
    for pid, proc in table.items():  # the title is the command line, spaces for its NULs
        if pid != os.getpid():
            with suppress(OSError):
                if marker in proc.title or marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    marked.add(pid)
    return {pid: table[pid] for pid in marked | (descendants(table, marked) - {os.getpid()})}


def replicas(table: dict[int, Proc], app: str) -> set[int]:
    """The worker processes of application ``app``'s Serve replicas (starting, running or stopping)."""
    title = re.compile(rf"ServeReplica:{re.escape(app)}:|SERVE_REPLICA::{re.escape(app)}#")
    return {pid for pid, proc in table.items() if title.search(proc.title)}


NOT_ENGINE = ("resource_tracker", "engines/reaper.py")
"""Titles of processes below a replica that are not its engine: multiprocessing's resource tracker and the engine
reaper (serve_app/engines/reaper.py), both there from before the engine starts."""


def engine_of(table: dict[int, Proc], replica: int) -> set[int]:
    """The processes of ``replica``'s engine (``VLLM::EngineCore``, its ``VLLM::Worker``), told by parentage:
    vLLM's process titles are not set at once."""
    return {pid for pid in descendants(table, [replica]) if not any(t in table[pid].title for t in NOT_ENGINE)}


def listening_ports(pid: int) -> set[int]:
    """The TCP ports ``pid`` listens on (its sockets' inodes among /proc/net/tcp's LISTEN entries): a Serve
    replica's own HTTP port (direct ingress) is one of them."""
    inodes = set()
    with suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def gcs_address(marker: str) -> str | None:
    """The GCS address (host:port) of the Ray cluster carrying ``marker``, from its raylet's command line. A
    driver must be given it: ``address="auto"`` falls back to any Ray cluster running on the machine when the
    cluster was started by ``ray.init`` (as ``serve run`` does), which records no address to find."""
    for proc in processes(marker).values():
        if match := re.search(r"--gcs-address=(\S+)", proc.title):
            return match.group(1)
    return None


def alive(procs: Iterable[Proc]) -> list[Proc]:
    """Those of ``procs`` still running: the same process (pid and start time) and not a zombie (a zombie
    has released its memory and only waits for its parent to reap it)."""
    out = []
    for proc in procs:
        now = read_proc(proc.pid)
        if now is not None and now.start == proc.start and now.state != "Z":
            out.append(now)
    return out


def stop(proc: subprocess.Popen, marker: str, wait_s: float = 90.0, settle_s: float = 10.0) -> list[int]:
    """SIGINT to ``proc``'s process group (what Ctrl-C does), SIGKILL if it has not exited in ``wait_s``;
    then up to ``settle_s`` for the rest to exit on their own, and SIGKILL to what is left. Removes the
    ``marker`` directory. Returns the pids that had to be killed after the group was gone."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=wait_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + settle_s
    while own_leftovers(marker) and time.monotonic() < deadline:  # Ray's shutdown stops most within seconds
        time.sleep(1)
    killed = own_leftovers(marker)
    for pid in killed:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(marker, ignore_errors=True)
    return killed
