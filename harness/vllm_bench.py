"""vLLM's own benchmark client (``vllm bench serve``) run from Python in a subprocess of its own: its command-line
entry point fails on vLLM's CPU build (it looks up a distribution named ``vllm``), its modules work.

``python -m harness.vllm_bench RESULT.json ARGS...`` runs the client with ``ARGS`` and saves its JSON there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .environment import ROOT, last_error, offline_env, tail


class ClientFailed(RuntimeError):
    """The client exited with an error, timed out or saved no result; the message says which."""


def run_client(argv: list[str], result: Path) -> None:
    """``vllm bench serve`` with ``argv``, in this process; saves its JSON to ``result``."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([*argv, "--result-dir", str(result.parent), "--result-filename", result.name])
    bench_main(args)  # synchronous: asyncio.run(main_async(args)); saves the JSON


def bench_serve(argv: list[str], result: Path, timeout_s: float) -> dict[str, Any]:
    """Run the client with ``argv`` in a fresh subprocess (its output beside ``result``, as a ``.log``); the JSON it
    saved (with ``--save-detailed`` in ``argv``: each request's outcome too)."""
    log = result.with_suffix(".log")
    with log.open("w") as out:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "harness.vllm_bench", str(result), *argv],
                cwd=ROOT,
                env=offline_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClientFailed(f"client timed out after {timeout_s:.0f} s") from exc
    if done.returncode != 0 or not result.exists():
        raise ClientFailed(f"client failed: {last_error(tail(log))}")
    return json.loads(result.read_text())


if __name__ == "__main__":
    run_client(sys.argv[2:], Path(sys.argv[1]))
