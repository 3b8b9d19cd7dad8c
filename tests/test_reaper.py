"""The engine reaper (serve_app/engines/reaper.py): once a worker that leads its own process group is gone, however
it went (SIGKILL here, as `ray stop --force` does with the raylet gone too), what is left of its group (its engine)
is stopped: SIGTERM, then SIGKILL for what ignores it. While the worker lives the reaper touches nothing; a worker
that is not a group leader gets no reaper. The real engine's case (`ray stop --force` on a serving app) is
tests/test_engine_cleanup.py's. No Ray here: a plain process stands in for the worker, a sleeping one for its engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.procs import alive
from serve_app.engines.procs import Proc, read_proc
from serve_app.engines.reaper import GRACE_S

ROOT = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from serve_app.engines.reaper import reap_group_on_exit
    reaper = reap_group_on_exit()
    assert reap_group_on_exit() is reaper  # once per process
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)" if IGNORES else "import time"
    engine = subprocess.Popen([sys.executable, "-c", code + "; print('up', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    engine.stdout.readline()  # its signal disposition is set
    print(json.dumps({"reaper": reaper and reaper.pid, "engine": engine.pid}), flush=True)
    if EXIT_CLEANLY:
        engine.kill()
        engine.wait()
        sys.exit(0)
    time.sleep(600)
    """
)


def wait_gone(procs: list[Proc], bound: float) -> float:
    """Seconds until every process of ``procs`` is gone; fails after ``bound``."""
    started = time.monotonic()
    while left := alive(procs):
        assert time.monotonic() - started < bound, f"still running after {bound:.0f} s: {left}"
        time.sleep(0.05)
    return time.monotonic() - started


def start_worker(ignores_sigterm: bool, exit_cleanly: bool = False, leader: bool = True):
    code = WORKER.replace("IGNORES", str(ignores_sigterm)).replace("EXIT_CLEANLY", str(exit_cleanly))
    worker = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=leader
    )
    pids = json.loads(worker.stdout.readline())
    return worker, pids


@pytest.mark.parametrize("ignores_sigterm", [False, True], ids=["engine stops on SIGTERM", "engine ignores it"])
def test_a_worker_killed_outright_leaves_no_engine(ignores_sigterm):
    worker, pids = start_worker(ignores_sigterm)
    engine, reaper = read_proc(pids["engine"]), read_proc(pids["reaper"])
    assert engine and reaper and engine.pgid == reaper.pgid == worker.pid  # all in the worker's group
    assert [p.pid for p in alive([engine, reaper])] == [engine.pid, reaper.pid]  # nothing touched while it lives
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    took = wait_gone([engine, reaper], GRACE_S + 20)
    if ignores_sigterm:
        assert took >= GRACE_S * 0.9  # SIGTERM first; SIGKILL only after the grace


def test_a_worker_that_exits_cleanly_leaves_its_reaper_nothing_to_do():
    worker, pids = start_worker(ignores_sigterm=True, exit_cleanly=True)
    reaper = read_proc(pids["reaper"])
    assert worker.wait(timeout=30) == 0
    assert reaper is not None
    wait_gone([reaper], 20)


def test_no_reaper_for_a_process_that_does_not_lead_its_group():
    worker, pids = start_worker(ignores_sigterm=False, leader=False)
    try:
        assert pids["reaper"] is None
    finally:
        os.kill(pids["engine"], signal.SIGKILL)
        worker.kill()
        worker.wait()
