"""No engine process outlives the Ray worker that started it, however the worker goes.

vLLM's ``EngineCore`` (a replica's child process, which holds the KV cache's memory, on a GPU the GPU's) does not
notice its owner dying. Ray kills it: each worker leads a process group of its own, which the raylet kills when the
worker exits (``serve.env``: ``RAY_process_group_cleanup_enabled``). That needs the raylet alive, and `ray stop
--force` SIGKILLs the raylet and every worker at once: the engine ran on, orphaned (found in a diagnostic run;
tests/test_engine_cleanup.py). So a worker that starts an engine first starts a reaper, a small process in its
group that waits for the worker to be gone (the end of a pipe only the worker holds) and then does what the
raylet would: SIGTERM to the group (vLLM's EngineCore stops its own workers on it), SIGKILL to what is left after
``GRACE_S``. `ray stop` does not stop the reaper: it kills by name (``raylet``, ``ray::...``), and this is neither.

    from serve_app.engines.reaper import in_ray_worker, reap_group_on_exit
    if in_ray_worker():
        reap_group_on_exit()   # once per process (more calls do nothing); then start the engine
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

GRACE_S = 5.0
"""How long the engine gets to stop on SIGTERM once its worker is gone, before SIGKILL."""

_reaper: subprocess.Popen | None = None  # holds the pipe's write end for as long as this process lives


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (a Serve replica, a Ray Data actor), not a driver or a plain script."""
    worker = sys.modules.get("ray._private.worker")
    return worker is not None and getattr(worker.global_worker, "mode", None) == worker.WORKER_MODE


def reap_group_on_exit() -> subprocess.Popen | None:
    """Start this process's reaper (see the module's docstring), once; None where this process does not lead a
    process group of its own (whose processes are then not all its own to kill) or where there is no /proc."""
    global _reaper
    if _reaper is not None:
        return _reaper
    if os.getpgid(0) != os.getpid() or not os.path.isdir("/proc"):
        logger.info("no reaper for this process's engine: it does not lead a process group of its own")
        return None
    # As a script (-E -s: nothing from the environment or user site), importing no package: a few MB, at once.
    _reaper = subprocess.Popen(
        [sys.executable, "-E", "-s", __file__, str(os.getpid())], stdin=subprocess.PIPE, close_fds=True
    )
    logger.info("engine reaper %d watches this process (%d) and its process group", _reaper.pid, os.getpid())
    return _reaper


def reap(worker: int, table: Callable[[], dict[int, Any]]) -> None:
    """The reaper itself: wait for ``worker`` (its parent) to be gone, then end what is left of its process group
    (``table``: :func:`.procs.process_table`)."""

    def others_in_group(group: int) -> list[int]:
        return [pid for pid, proc in table().items() if proc.pgid == group and pid != os.getpid()]

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the worker, not for the reaper
    sys.stdin.buffer.read()  # EOF once no process holds the write end: the worker exits, however it does
    while os.getppid() == worker:  # until it has exited (its children pass to another parent), not just closed it
        time.sleep(0.05)
    group = os.getpgid(0)
    if not others_in_group(group):
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while others_in_group(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)  # this process too


if __name__ == "__main__":  # as reap_group_on_exit starts it: this file's folder first on sys.path
    from procs import process_table

    reap(int(sys.argv[1]), process_table)
