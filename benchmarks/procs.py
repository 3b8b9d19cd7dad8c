"""Stopping a server started as a subprocess, and everything it started, so no run leaks into the next.

A peer runs in its own process group with a private marker in its environment (its ``RAY_TMPDIR``). Ray's
workers leave that group, and vLLM's engine processes are the replica's children, not the driver's: when a
replica dies before its engine has shut down, the ``VLLM::EngineCore`` it started is re-parented to init and
keeps its memory (gigabytes) and some CPU. Every one of them still carries the marker in its environment,
which is how :func:`stop` finds them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path


def own_leftovers(marker: str) -> list[int]:
    """Processes that name ``marker`` in their command line or environment (this process excepted): Ray's
    daemons and workers (a worker renames itself ``ray::...`` but keeps the environment it inherited) and
    the engine processes those workers started."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
    return pids


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
