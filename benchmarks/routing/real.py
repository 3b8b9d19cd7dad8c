"""Routing part (b): two real vLLM replicas on this 2-core machine, each engine on a core of its own, with the
same seeded load through each peer's HTTP proxy (whose router is the one under test).

Peers (each started alone, one after the other; every engine runs one compute thread, unbound by vLLM
(``VLLM_CPU_OMP_THREADS_BIND=nobind``), and once both are up this script pins each engine's processes to a core
of its own):

  app-tokens            serve_config.yaml's app, 2 replicas, ``routing.router: tokens`` (its default)
  app-tokens-noprefix   the same without the token router's prefix score (``routing.prefix_weight: 0``)
  app-tokens-guarded    the prefix score as it was until 2026-11-30: ``prefix_weight: 1``, ``prefix_max_share: 0.25``
  app-tokens-sessions   app-tokens, each conversation's turns sent with an ``x-session-id`` of its own (the token
                        router's session affinity; the prefix workload only)
  app-serve             the same app with ``routing.router: serve``: Serve's router as shipped (with serve.env's
                        HAProxy at the door, HAProxy's own balancing; app-tokens's POSTs go through the app's
                        ingress router first)
  app-*-python-proxy    either with Serve's Python proxy at the door (``RAY_SERVE_ENABLE_HA_PROXY=0``): the
                        token router runs in the proxy, Serve's default is its power of two choices
  app-*-nice19          either with ``vllm.cpu_replica_niceness: 19`` (the default before 2026-11-25): the
                        replicas' own work (HTTP, tokenizing, admission, streaming) yields to the engines' compute
  ray-serve-llm         Ray Serve LLM (``build_openai_app``), 2 replicas, Serve's default router, as shipped
  ray-serve-llm-prefix  the same with Ray Serve LLM's ``PrefixCacheAffinityRouter``

The ``nice19`` and ``python-proxy`` variants run only when ``--peers`` names them.

**Load** (one seeded schedule for all, open loop): streamed ``/v1/completions`` "chats" in Poisson arrivals, each a
prompt of random words and an output length drawn log-uniformly (most short, a few long); beside them, at regular
times, non-streamed ``/v1/completions`` calls of many prompts (what one ``/generate`` of many prompts, or a Ray Data
batch, is to a router: one request). The prompts share no prefix, so the prefix-aware router has nothing to match
and balances as its fallback does. Two workloads (``WORKLOADS``, ``--workload``):

  chats     outputs 8-256 tokens, a 16-prompt x 64-token call every 30 s: a light load, few tokens to balance
  batches   the issue's skewed load, scaled to these cores: outputs 8-512 tokens, a 256-prompt x 16-token call
            every 90 s (more than a replica's running cap of 128 sequences: it holds one replica for over a minute)
  prefixes  closed loop: 32 streamed chat conversations, each 4 of them sharing a 1,500-token system prompt, each
            turn's prompt its conversation so far (``prefix_load``); TTFT of every turn and of the later turns

**Measured**: output tok/s (every output token / from the first request sent to the last answer), the chats' TTFT
p50/p99 and E2E p99, the batch calls' mean latency, failures; ratios against ``app-serve``. For the app's peers also
how evenly the load was spread: each replica's ``/stats`` read every second (tokens held, queued + in flight;
prompts in flight), the mean of (most - least) / total over the samples (0: even, 1: all on one replica).

    python -m benchmarks.routing.real [--quick] [--workload batches] [--peers ...] [--rounds 2]
    # benchmarks/results/routing_real[-batches][-quick].{md,json}; --workload prefixes [--varied-answers]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from harness.procs import engine_of, processes, replicas

from ..lib.peers import KV_CACHE_GIB, NO_HAPROXY
from ..lib.report import RESULTS
from ..serving.peers import running
from . import prefix_load
from .real_load import LOAD_S, REQUEST_FIELDS, WORKLOADS, load, schedule, summarize
from .real_page import markdown, prefix_markdown
from .spread import Spread, stats_urls

REPLICAS = 2
PEERS: dict[str, tuple[str, dict[str, Any]]] = {
    "app-tokens": ("app", {"routing": {"router": "tokens"}}),
    "app-tokens-noprefix": ("app", {"routing": {"router": "tokens", "prefix_weight": 0}}),
    "app-tokens-guarded": ("app", {"routing": {"router": "tokens", "prefix_weight": 1, "prefix_max_share": 0.25}}),
    "app-tokens-sessions": ("app", {"routing": {"router": "tokens"}}),  # its client sends x-session-id
    "app-tokens-responses": ("app", {"routing": {"router": "tokens"}}),  # its client: Responses API turns
    "app-tokens-responses-noaffinity": ("app", {"routing": {"router": "tokens", "session_affinity": False}}),
    "app-serve": ("app", {"routing": {"router": "serve"}}),
    "app-tokens-nice19": ("app", {"routing": {"router": "tokens"}, "vllm": {"cpu_replica_niceness": 19}}),
    "app-serve-nice19": ("app", {"routing": {"router": "serve"}, "vllm": {"cpu_replica_niceness": 19}}),
    "app-tokens-python-proxy": ("app", {"routing": {"router": "tokens"}}),
    "app-serve-python-proxy": ("app", {"routing": {"router": "serve"}}),
    "ray-serve-llm": ("ray-serve-llm", {}),
    "ray-serve-llm-prefix": ("ray-serve-llm", {"router": "ray.serve.llm.request_router.PrefixCacheAffinityRouter"}),
}
PEER_ENV = {name: NO_HAPROXY for name in PEERS if name.endswith("-python-proxy")}
"""The app with Serve's Python proxy at the door instead of serve.env's HAProxy: the token router then runs in the
proxy, as Serve's own routers do, instead of in an ingress router HAProxy asks first."""
OPTIONAL = ("nice", "python-proxy", "responses")  # variants run when named, not by default
DEFAULT_WORKLOAD = "chats"  # its page is routing_real.md; another workload's is routing_real-<name>.md
PREFIXES = "prefixes"  # the closed-loop conversations of prefix_load, not a schedule of WORKLOADS
SESSION_PEERS = ("app-tokens-sessions",)
"""Peers whose client names each conversation in Serve's session header."""
CLIENT = {**dict.fromkeys(SESSION_PEERS, "sessions"), **{p: "responses" for p in PEERS if "responses" in p}}
"""The prefix workload's client of each peer that does not send chat completions (:data:`.prefix_load.CLIENTS`):
the Responses peers' send each turn after the stored response before it (``previous_response_id``), so the router
reads only a turn's new messages and knows a follow-up's replica only from that id (``-noaffinity``: not from it)."""
PREFIX_VARIANTS = ("app-tokens-noprefix", "app-tokens-guarded", *SESSION_PEERS)
"""Variants of the token router's prefix score and session affinity: they run on the prefix workload alone."""
PREFIX_PEERS = ["app-tokens", *PREFIX_VARIANTS, "app-serve", "ray-serve-llm-prefix"]


def engines_started(ray_tmp: str) -> int:
    """Engine replicas (``LLMServer``, in both the app and Ray Serve LLM) that Serve's controller reports started
    (its log: "... started successfully ...")."""
    logs = Path(ray_tmp).glob("ray/session_latest/logs/serve/controller_*.log")
    lines = (line for p in logs for line in p.read_text(errors="replace").splitlines())
    return sum("started successfully" in line and "LLMServer" in line for line in lines)


def pin_engines(ray_tmp: str) -> list[int]:
    """Each engine of the peer's ``llm`` app (what its replica started: :func:`harness.procs.engine_of`, by
    parentage, as vLLM's process titles come late) onto a core of its own, every thread (``sched_setaffinity`` is
    per thread); the replicas whose engine was pinned."""
    table_ = processes(ray_tmp)
    cores = sorted(os.sched_getaffinity(0))
    pinned: list[int] = []
    for replica in sorted(replicas(table_, "llm")):
        engine = engine_of(table_, replica)  # none below the ingress router, or an engine not started yet
        core = cores[len(pinned) % len(cores)]
        for pid in engine:
            with suppress(OSError):  # a process that just ended
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with suppress(OSError):  # a thread that just ended
                        os.sched_setaffinity(int(tid), {core})
        if engine:
            pinned.append(replica)
    return pinned


def scheduled(events: list[dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
    """The load of a schedule of ``WORKLOADS``: its figures and its requests."""

    def drive(url: str) -> dict[str, Any]:
        outcomes = asyncio.run(load(url, events))
        return {**summarize(outcomes), "requests": [{key: o.get(key) for key in REQUEST_FIELDS} for o in outcomes]}

    return drive


def conversing(
    systems: list[str], load_s: float, client: str = "chat", varied: bool = False
) -> Callable[[str], dict[str, Any]]:
    """The prefix workload's closed-loop conversations (``client``: how they are sent, :data:`.prefix_load.CLIENTS`;
    ``varied``: answers of varied length): their figures and their turns."""

    def drive(url: str) -> dict[str, Any]:
        outcomes = asyncio.run(prefix_load.conversations(url, systems, load_s, client=client, varied=varied))
        fields = prefix_load.REQUEST_FIELDS
        return {**prefix_load.summarize(outcomes), "requests": [{k: o.get(k) for k in fields} for o in outcomes]}

    return drive


def measure_peer(
    name: str, folder: Path, workdir: Path, drive: Callable[[str], dict[str, Any]], kv_cache_gib: float
) -> dict[str, Any]:
    kind, knobs = PEERS[name]
    threads = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "ENGINE_THREADS": "1", **PEER_ENV.get(name, {})}
    if kind == "app":
        fleet = {
            "autoscaling": {"min_replicas": REPLICAS, "max_replicas": REPLICAS},
            "vllm": {"cpu_threads": 1, "cpu_kvcache_space_gb": kv_cache_gib},
            "embeddings_app": None,  # the generation app alone, as Ray Serve LLM's
        }
        merged = {key: {**fleet.get(key, {}), **value} for key, value in knobs.items()}  # a knob keeps its section
        started = running(kind, folder, workdir, 900, fleet={**fleet, **merged}, extra_env=threads)
    else:
        extra = ["--replicas", str(REPLICAS), "--kv-cache-gib", str(kv_cache_gib)]
        extra += ["--router", knobs["router"]] if knobs else []
        started = running(kind, folder, workdir, 900, extra, extra_env=threads)
    with started as (url, startup_s, ray_tmp):
        deadline = time.monotonic() + 600
        while engines_started(ray_tmp) < REPLICAS:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {engines_started(ray_tmp)} of {REPLICAS} replicas started")
            time.sleep(2)
        pinned = pin_engines(ray_tmp)
        deadline = time.monotonic() + 60  # one read of the process table has missed an engine: look again
        while len(pinned) != REPLICAS and time.monotonic() < deadline:
            time.sleep(2)
            pinned = pin_engines(ray_tmp)
        if len(pinned) != REPLICAS:
            table_ = processes(ray_tmp)
            below = {r: [table_[p].title[:40] for p in engine_of(table_, r)] for r in replicas(table_, "llm")}
            raise RuntimeError(f"{name}: {len(pinned)} engines found to pin, not {REPLICAS} (by replica: {below})")
        warm = [{"at": 0.0, "kind": "chat", "prompt": "warm up " * 8, "max_tokens": 8} for _ in range(8)]
        asyncio.run(load(url, warm))
        with Spread(stats_urls(ray_tmp)) as spread:
            figures = drive(url)  # with "requests", the JSON's, for analysis
        row = {"peer": name, "startup_s": startup_s, "engines_pinned": len(pinned), **figures, **spread.summary()}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routing.real", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 s of load a peer")
    parser.add_argument("--peers", nargs="+", choices=list(PEERS), help="default: every peer the workload compares")
    parser.add_argument("--workload", choices=[*WORKLOADS, PREFIXES], default=DEFAULT_WORKLOAD)
    parser.add_argument("--rounds", type=int, default=1, help="run every peer this many times, one after the other")
    parser.add_argument(
        "--kv-cache-gib",
        type=float,
        default=KV_CACHE_GIB,
        help=f"each engine's KV cache (default {KV_CACHE_GIB}); smaller: fewer prefixes fit on every replica",
    )
    parser.add_argument(
        "--varied-answers",
        action="store_true",
        help="prefixes: each answer {}-{} tokens, drawn per turn, not {}: the conversations fall out of step".format(
            *prefix_load.VARIED_ANSWERS, prefix_load.ANSWER_TOKENS
        ),
    )
    args = parser.parse_args(argv)
    if args.varied_answers and args.workload != PREFIXES:
        parser.error(f"--varied-answers is for --workload {PREFIXES}, whose conversations answer in turns")
    from serve_app.models import prepare

    began = time.monotonic()
    mode = "quick" if args.quick else "full"
    folder = prepare()
    if args.workload == PREFIXES:
        systems = prefix_load.system_prompts(folder)
        drives = {c: conversing(systems, LOAD_S[mode], c, args.varied_answers) for c in prefix_load.CLIENTS}
        args.peers = args.peers or PREFIX_PEERS
    else:
        events = schedule(WORKLOADS[args.workload], LOAD_S[mode])
        drives = dict.fromkeys(prefix_load.CLIENTS, scheduled(events))
        args.peers = args.peers or [p for p in PEERS if not any(o in p for o in OPTIONAL) and p not in PREFIX_VARIANTS]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="routing-real-") as tmp:
        for round_ in range(args.rounds):
            for name in args.peers:
                try:
                    row = measure_peer(name, folder, Path(tmp), drives[CLIENT.get(name, "chat")], args.kv_cache_gib)
                except Exception as exc:  # a peer that does not deploy is reported as such; the others still run
                    row = {"peer": name, "error": repr(exc)[:300]}
                row["round"] = round_
                print(json.dumps({k: v for k, v in row.items() if k != "requests"}, default=str), flush=True)
                rows.append(row)
    suffix = "" if args.workload == DEFAULT_WORKLOAD else f"-{args.workload}"
    suffix += "" if args.kv_cache_gib == KV_CACHE_GIB else f"-cache{args.kv_cache_gib:g}gib"
    suffix += "-varied" if args.varied_answers else ""
    suffix += "-quick" if args.quick else ""
    minutes = (time.monotonic() - began) / 60
    text = (
        prefix_markdown(rows, mode, minutes, prefix_load.cache_size(folder, args.kv_cache_gib), args.varied_answers)
        if args.workload == PREFIXES
        else markdown(rows, mode, args.workload, events, minutes)
    )
    (RESULTS / f"routing_real{suffix}.md").write_text(text)
    (RESULTS / f"routing_real{suffix}.json").write_text(json.dumps(rows, indent=2, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
