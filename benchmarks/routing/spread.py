"""How evenly a fleet's router spread its load: each app replica's own ``/stats`` (its direct-ingress port, found
among the ports the replica's process listens on), read every second while the load runs, then the mean
imbalance of tokens held and of prompts in flight, and each replica's prefix-cache hit rate. For
``benchmarks.routing.real``.

    with Spread(stats_urls(ray_tmp)) as spread:
        ...                                   # the load
    spread.summary()                          # {"held_imbalance": ..., "running_imbalance": ..., ...}
"""

from __future__ import annotations

import http.client
import json
import math
import statistics
import threading
import urllib.request
from contextlib import suppress
from typing import Any

from harness.procs import listening_ports, processes, replicas

UNREADABLE = (OSError, ValueError, http.client.HTTPException)
"""No ``/stats`` there: nothing listens, not JSON, or not HTTP/1 (a gRPC port answers in HTTP/2 frames)."""


def stats_urls(ray_tmp: str) -> list[str]:
    """Each engine replica's own ``/stats`` (the app's peers: its direct-ingress port, found among the ports the
    replica's process listens on); none for a peer without one (Ray Serve LLM, whose replicas' other ports speak
    gRPC: an ``HTTPException`` here)."""
    table_ = processes(ray_tmp)
    urls = []
    for pid in sorted(replicas(table_, "llm")):
        if "LLMServer" not in table_[pid].title:
            continue
        for port in sorted(listening_ports(pid)):
            url = f"http://127.0.0.1:{port}/stats"
            with suppress(*UNREADABLE), urllib.request.urlopen(url, timeout=2) as response:
                if "batcher" in json.loads(response.read()):
                    urls.append(url)
                    break
    return urls


class Spread:
    """Samples each replica's tokens held (queued + in flight, the router's own measure) and requests in flight
    (prompts running) every ``period_s`` while the load runs: how evenly the router spread them."""

    def __init__(self, urls: list[str], period_s: float = 1.0) -> None:
        self.urls, self.period_s = urls, period_s
        self.samples: list[tuple[list[int], list[int]]] = []
        self.prompts: list[list[tuple[int, int]]] = []  # each sample's (prompt tokens, cached) of every replica
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Spread:
        if self.urls:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.period_s):
            held, running_, prompts = [], [], []
            for url in self.urls:
                try:
                    with urllib.request.urlopen(url, timeout=2) as response:
                        stats = json.loads(response.read())
                    batcher, engine = stats["batcher"], stats["engine_stats"]
                except (*UNREADABLE, KeyError):
                    break
                held.append(batcher["queued_cost"] + batcher["in_flight_cost"])
                running_.append(batcher["in_flight"])
                prompts.append((engine.get("prompt_tokens", 0), engine.get("cached_prompt_tokens", 0)))
            else:
                self.samples.append((held, running_))
                self.prompts.append(prompts)

    def summary(self) -> dict[str, Any]:
        """The mean imbalance, (most - least) / total over the samples with any load (0: even, 1: all on one),
        of tokens held and of requests in flight."""

        def imbalance(index: int) -> float:
            values = [(max(s[index]) - min(s[index])) / sum(s[index]) for s in self.samples if sum(s[index])]
            return statistics.mean(values) if values else math.nan

        return {
            "held_imbalance": imbalance(0),
            "running_imbalance": imbalance(1),
            "spread_samples": len(self.samples),
            "replica_hit_rates": self.hit_rates(),
        }

    def hit_rates(self) -> list[float]:
        """Each replica's prefix-cache hit rate over the samples: of the prompt tokens its engine finished between
        the first sample and the last, the share its prefix cache held (vLLM's ``num_cached_tokens``)."""
        if len(self.prompts) < 2:
            return []
        spans = zip(self.prompts[0], self.prompts[-1], strict=True)
        return [(c1 - c0) / (p1 - p0) if p1 > p0 else math.nan for (p0, c0), (p1, c1) in spans]
